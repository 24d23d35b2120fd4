"""The one shape every corpus takes: a vocabulary plus token-id arrays for train/valid/test."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from exatrain.data.vocab import Vocab
from exatrain.errors import DataError

SPLITS = ("train", "valid", "test")
PREPARE_HINT_CMD = "exatrain data prepare wikitext-2 --out DIR"


@dataclass
class Corpus:
    """A tokenised corpus.

    ``splits`` maps "train", "valid" and "test" to 1-D ``np.int32`` arrays of token ids (possibly
    read-only memory maps from the cache); ``meta`` holds facts about how it was made (source files,
    options, and for the synthetic corpus its ideal perplexity).
    """

    name: str
    vocab: Vocab
    splits: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)

    def split(self, name: str) -> np.ndarray:
        """The token array of split ``name``; a DataError names the available splits if it is missing."""
        try:
            return self.splits[name]
        except KeyError:
            raise DataError(
                f"corpus {self.name!r} has no split {name!r} (it has: {', '.join(self.splits)})",
                f"use one of: {', '.join(self.splits)}",
            ) from None

    @property
    def vocab_size(self) -> int:
        """Number of token ids (the model's embedding/output size)."""
        return len(self.vocab)

    def summary(self) -> str:
        """One line for logs: name, vocabulary size and tokens per split."""
        parts = ", ".join(f"{k} {len(v):,}" for k, v in self.splits.items())
        return f"{self.name}: vocab {len(self.vocab):,}, tokens: {parts}"


def read_lines(path: str | os.PathLike) -> list[str]:
    """Read a UTF-8 text file as a list of lines, turning I/O and decoding failures into DataError."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.readlines()
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{path} is not valid UTF-8 text ({exc.reason} at byte {exc.start})",
            f"convert it to UTF-8 (e.g. `iconv -f latin1 -t utf-8 {path}`) or remove it from the "
            "data directory",
        ) from exc
    except OSError as exc:
        raise DataError(
            f"cannot read data file {path}: {exc.strerror or exc}",
            "check that the file exists and is readable by this user on every node",
        ) from exc


def check_not_empty(corpus: Corpus, where: str, hint: str | None = None) -> Corpus:
    """Raise DataError if the train or valid split has no tokens: nothing to learn or to measure."""
    for split in ("train", "valid"):
        if split in corpus.splits and len(corpus.splits[split]) == 0:
            raise DataError(
                f"the {split} split of corpus {corpus.name!r} ({where}) has no tokens",
                hint
                or "point data.path at a directory with non-empty text files "
                '(or use data.kind = "synthetic" to train on generated data)',
            )
    return corpus


def check_dir(path: str | os.PathLike | None, kind: str) -> Path:
    """Return ``path`` as a Path if it is an existing directory, else raise DataError saying how to get
    one."""
    if kind == "wikitext":
        get = (
            f"run `{PREPARE_HINT_CMD}` on a machine with internet (e.g. a login node) and set "
            "data.path to DIR"
        )
    else:
        get = (
            "put your text files (*.txt, *.md, ...) in a directory readable from every node and set "
            "data.path to it"
        )
    if path is None or str(path) == "":
        raise DataError(
            f"data.kind = {kind!r} needs a directory, but no data.path was given",
            f'{get}; or use data.kind = "synthetic" (generated data, no files)',
        )
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(f"data directory {p} does not exist", f"fix data.path, or {get}")
    if not p.is_dir():
        raise DataError(
            f"data path {p} is not a directory",
            "set data.path to the directory that holds the text files, not to a file",
        )
    return p
