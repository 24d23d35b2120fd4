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


def load_corpus(kind: str, path: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None, **options: Any) -> Corpus:
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
    readers: dict[str, tuple[Callable[..., Corpus], int]] = {
        "synthetic": (synthetic_corpus, 0),
        "wikitext": (load_wikitext, 1),
        "text": (load_text_dir, 1),
    }
    if kind not in readers:
        raise DataError(
            f"unknown data kind {kind!r}",
            f"set data.kind to one of: {', '.join(KINDS)}",
        )
    reader, skip = readers[kind]
    defaults = _options_of(reader, skip)
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise DataError(
            f"unknown option(s) {', '.join(unknown)} for data kind {kind!r}",
            f"valid options for {kind!r}: {', '.join(defaults) or 'none'}",
        )
    if kind == "text" and not options.get("max_vocab"):
        options["max_vocab"] = None  # the config's 0 means "no cap"
    effective = {**defaults, **options}

    if kind == "synthetic":
        sources: list[Path] = []
        build = lambda: synthetic_corpus(**effective)  # noqa: E731
    elif kind == "wikitext":
        sources = list(wikitext_sources(path, effective["train_from"], effective["valid_from"], effective["test_from"]).values())
        build = lambda: load_wikitext(path, **effective)  # noqa: E731
    else:
        sources = text_files(path)
        build = lambda: load_text_dir(path, **effective)  # noqa: E731

    corpus = cached_corpus(cache_dir, kind, sources, effective, build)
    return check_not_empty(corpus, str(path) if path else kind)
