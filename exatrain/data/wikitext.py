"""WikiText-2 (word-level) directories: ``wiki.{train,valid,test}.tokens`` or ``{train,valid,test}.txt``.

The vocabulary comes from the training split only, so words of valid/test that never occur in
training become ``<unk>`` (the standard WikiText evaluation setting).
"""

from __future__ import annotations

import os
from pathlib import Path

from exatrain.data.corpus import PREPARE_HINT_CMD, SPLITS, Corpus, check_dir, check_not_empty, read_lines
from exatrain.data.vocab import Vocab
from exatrain.errors import DataError


def _names(split: str) -> tuple[str, str]:
    return (f"wiki.{split}.tokens", f"{split}.txt")


def find_splits(path: str | os.PathLike) -> dict[str, Path]:
    """Map each split name present in the directory to its file (``wiki.*.tokens`` wins over ``*.txt``)."""
    d = Path(path)
    found: dict[str, Path] = {}
    for split in SPLITS:
        for name in _names(split):
            f = d / name
            if f.is_file():
                found[split] = f
                break
    return found


def wikitext_sources(
    path: str | os.PathLike, train_from: str = "train", valid_from: str | None = None, test_from: str = "test"
) -> dict[str, Path]:
    """The files that make the corpus's train/valid/test splits, or a DataError naming what is missing.

    ``valid_from=None`` means "valid", except when training on "valid" (then "test" validates).
    """
    d = check_dir(path, "wikitext")
    roles = _roles(train_from, valid_from, test_from)
    found = find_splits(d)
    missing = sorted({src for src in roles.values() if src not in found}, key=SPLITS.index)
    if missing:
        present = ", ".join(f.name for f in found.values()) or "no split files"
        looked = "; ".join(" or ".join(_names(s)) for s in missing)
        if "train" in missing and roles["train"] == "train" and found:
            hint = (
                f"download the full corpus with `{PREPARE_HINT_CMD}` on a login node and set "
                "data.path to DIR; "
                f'or, for a smoke test only, train on another split with train_from="{next(iter(found))}"'
            )
        else:
            hint = (
                f"run `{PREPARE_HINT_CMD}` on a machine with internet (e.g. a login node) and set "
                "data.path to DIR, "
                "or copy the split files into the directory by hand"
            )
        raise DataError(
            f"WikiText directory {d} lacks the {', '.join(missing)} split (looked for {looked}; "
            f"found: {present})",
            hint,
        )
    return {role: found[src] for role, src in roles.items()}


def _roles(train_from: str, valid_from: str | None, test_from: str) -> dict[str, str]:
    if valid_from is None:
        valid_from = "test" if train_from == "valid" else "valid"
    roles = {"train": train_from, "valid": valid_from, "test": test_from}
    for role, src in roles.items():
        if src not in SPLITS:
            raise DataError(
                f"{role}_from = {src!r} is not a WikiText split",
                f"use one of: {', '.join(SPLITS)}",
            )
    return roles


def load_wikitext(
    path: str | os.PathLike, train_from: str = "train", valid_from: str | None = None, test_from: str = "test"
) -> Corpus:
    """Tokenise a WikiText-format directory into a :class:`Corpus` (vocabulary from the train source).

    ``train_from`` picks the file the "train" split is read from (e.g. "valid" for a directory that only
    has valid/test files, as in smoke tests and benchmarks); ``valid_from``/``test_from`` likewise.
    """
    files = wikitext_sources(path, train_from, valid_from, test_from)
    texts = {role: read_lines(f) for role, f in files.items()}
    vocab = Vocab.build(texts["train"])
    splits = {role: vocab.encode_lines(lines) for role, lines in texts.items()}
    corpus = Corpus(
        name="wikitext",
        vocab=vocab,
        splits=splits,
        meta={"path": str(Path(path).expanduser()), "files": {r: f.name for r, f in files.items()}},
    )
    return check_not_empty(corpus, str(path))
