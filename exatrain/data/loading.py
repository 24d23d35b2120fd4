"""One entry point from configuration to a ready :class:`Corpus`: pick the reader, go through the cache."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from exatrain.data.cache import cached_corpus
from exatrain.data.corpus import Corpus, check_not_empty
from exatrain.data.rawtext import load_text_dir, text_files
from exatrain.data.synthetic import synthetic_corpus
from exatrain.data.wikitext import load_wikitext, wikitext_sources
from exatrain.errors import DataError

KINDS = ("synthetic", "wikitext", "text")


def _options_of(fn: Callable[..., Any], skip: int) -> dict[str, Any]:
    params = list(inspect.signature(fn).parameters.values())[skip:]
    return {p.name: p.default for p in params}


#: Per kind, the options load_corpus accepts and their defaults (the reader's keyword parameters).
OPTIONS: dict[str, dict[str, Any]] = {
    "synthetic": _options_of(synthetic_corpus, 0),
    "wikitext": _options_of(load_wikitext, 1),
    "text": _options_of(load_text_dir, 1),
}


def load_corpus(
    kind: str,
    path: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    **options: Any,
) -> Corpus:
    """Load (or generate) corpus ``kind`` from ``path``, tokenised once and then served from ``cache_dir``.

    Kinds and their options:

    * ``"synthetic"``: no files (``path`` is ignored); options of :func:`synthetic_corpus`
      (seed, vocab_size, n_train_tokens, n_valid_tokens, n_test_tokens, n_topics).
    * ``"wikitext"``: a WikiText-2 format directory; options train_from, valid_from, test_from
      (see :func:`load_wikitext`).
    * ``"text"``: a directory of raw text; option max_vocab (see :func:`load_text_dir`).

    ``cache_dir`` None/empty disables the cache. Every problem (unknown kind or option, missing or empty
    directory, empty train split) raises DataError with a hint.
    """
    if kind not in OPTIONS:
        raise DataError(
            f"unknown data kind {kind!r}",
            f"set data.kind to one of: {', '.join(KINDS)}",
        )
    defaults = OPTIONS[kind]
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise DataError(
            f"unknown option(s) {', '.join(unknown)} for data kind {kind!r}",
            f"valid options for {kind!r}: {', '.join(defaults) or 'none'}",
        )
    if kind == "text" and not options.get("max_vocab"):
        options["max_vocab"] = None  # the config's 0 means "no cap"
    effective = {**defaults, **options}

    sources: list[Path] = []
    if kind == "wikitext":
        roles = wikitext_sources(
            path, effective["train_from"], effective["valid_from"], effective["test_from"]
        )
        sources = list(roles.values())
    elif kind == "text":
        sources = text_files(path)

    def build() -> Corpus:
        if kind == "synthetic":
            return synthetic_corpus(**effective)
        if kind == "wikitext":
            return load_wikitext(path, **effective)
        return load_text_dir(path, **effective)

    corpus = cached_corpus(cache_dir, kind, sources, effective, build)
    if kind == "synthetic":
        return check_not_empty(
            corpus, "generated", hint="set n_train_tokens and n_valid_tokens to positive counts"
        )
    return check_not_empty(corpus, str(path))
