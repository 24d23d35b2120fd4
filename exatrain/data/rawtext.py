"""A directory of raw text files as a corpus, split into train/valid/test by line number.

Files: every regular file under the directory (recursively) whose suffix is one of ``.txt``, ``.md``,
``.text``, ``.tokens`` or none, skipping hidden files and directories (names starting with ``.``);
read in sorted relative-path order so every rank and every run sees the same stream.

Split rule: number the non-blank lines of all files 1, 2, 3, ... in that order. Every 20th line
(20, 40, ...) goes to valid, the line after it (21, 41, ...) to test, all others to train: about
90 % / 5 % / 5 %, deterministic, and interleaved so each split samples the whole collection.
"""

from __future__ import annotations

import os
from pathlib import Path

from exatrain.data.corpus import Corpus, check_dir, check_not_empty, read_lines
from exatrain.data.vocab import Vocab
from exatrain.errors import DataError

TEXT_SUFFIXES = frozenset({".txt", ".md", ".text", ".tokens", ""})
EVERY = 20


def text_files(path: str | os.PathLike) -> list[Path]:
    """The usable text files under ``path`` in deterministic order; DataError if there are none."""
    root = check_dir(path, "text")
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            f = Path(dirpath) / name
            if name.startswith(".") or f.suffix.lower() not in TEXT_SUFFIXES or not f.is_file():
                continue
            files.append(f)
    files.sort(key=lambda f: f.relative_to(root).as_posix())
    if not files:
        raise DataError(
            f"text directory {root} has no usable text files",
            "put UTF-8 text files with suffix .txt, .md, .text, .tokens (or none) in it, or fix data.path",
        )
    return files


def split_of(line_number: int) -> str:
    """The split of the ``line_number``-th non-blank line (1-based): 20th -> valid, 21st -> test, ..."""
    if line_number % EVERY == 0:
        return "valid"
    if line_number % EVERY == 1 and line_number > EVERY:
        return "test"
    return "train"


def split_lines(lines_per_file: list[list[str]]) -> dict[str, list[str]]:
    """Distribute the non-blank lines of all files over train/valid/test by :func:`split_of`."""
    out: dict[str, list[str]] = {"train": [], "valid": [], "test": []}
    n = 0
    for lines in lines_per_file:
        for line in lines:
            if not line.strip():
                continue
            n += 1
            out[split_of(n)].append(line)
    return out


def load_text_dir(path: str | os.PathLike, max_vocab: int | None = None) -> Corpus:
    """Tokenise a directory of raw text into a :class:`Corpus` (vocabulary from train).

    ``max_vocab`` caps the vocabulary size (including ``<eos>`` and ``<unk>``) to the most frequent
    training words; rarer words become ``<unk>``. ``None`` or 0 keeps every word.
    """
    files = text_files(path)
    parts = split_lines([read_lines(f) for f in files])
    vocab = Vocab.build(parts["train"], max_size=max_vocab or None)
    splits = {name: vocab.encode_lines(lines) for name, lines in parts.items()}
    corpus = Corpus(
        name="text",
        vocab=vocab,
        splits=splits,
        meta={"path": str(Path(path).expanduser()), "files": len(files), "max_vocab": max_vocab or None},
    )
    return check_not_empty(
        corpus,
        str(path),
        hint=f"a text corpus needs at least {EVERY} non-blank lines (every {EVERY}th goes to valid) "
        "and real words; "
        'add more text to the directory, or use data.kind = "synthetic"',
    )
