"""Word-level vocabulary: whitespace tokens to stable integer ids and back.

Ids are deterministic so that every rank (and every later run) that builds the vocabulary from the
same text gets the same ids: ``<eos>`` is 0, ``<unk>`` is 1, then the other tokens by descending count,
ties broken by the token string.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from exatrain.errors import DataError

EOS = "<eos>"
UNK = "<unk>"
EOS_ID = 0
UNK_ID = 1
_FORMAT = "exatrain-vocab"
_VERSION = 1


def tokenize_line(line: str) -> list[str]:
    """Split one line of text into word tokens (on any whitespace); blank lines give ``[]``.

    One place defines tokenisation so that vocabulary building and encoding can never disagree.
    """
    return line.split()


class Vocab:
    """An ordered list of word tokens; a token's id is its position.

    ``<eos>`` (id 0) and ``<unk>`` (id 1) are always present. Build one from text with
    :meth:`Vocab.build`, turn text into ids with :meth:`encode_lines`.
    """

    def __init__(self, tokens: Sequence[str]):
        tokens = list(tokens)
        if len(tokens) < 2 or tokens[EOS_ID] != EOS or tokens[UNK_ID] != UNK:
            raise DataError(
                f"vocabulary must start with {EOS!r}, {UNK!r}; got {tokens[:2]!r}",
                "build vocabularies with Vocab.build() or load them with Vocab.from_json()",
            )
        index = {tok: i for i, tok in enumerate(tokens)}
        if len(index) != len(tokens):
            dupes = sorted(t for t, c in Counter(tokens).items() if c > 1)
            raise DataError(
                f"vocabulary has duplicate tokens: {dupes[:5]!r}",
                "each token may appear once; rebuild the vocabulary with Vocab.build()",
            )
        self._tokens = tokens
        self._index = index

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(cls, lines: Iterable[str], max_size: int | None = None) -> Vocab:
        """Count the whitespace tokens of ``lines`` and order them into a vocabulary.

        ``max_size`` caps the vocabulary (counting ``<eos>`` and ``<unk>``): only the most frequent
        tokens are kept and the rest will encode as ``<unk>``. ``None`` keeps every token.
        """
        if max_size is not None and max_size < 2:
            raise DataError(
                f"vocabulary size cap {max_size} is too small (it counts <eos> and <unk>)",
                "set max_vocab to at least 3, or to 0/None to keep every word",
            )
        counts: Counter[str] = Counter()
        for line in lines:
            counts.update(tokenize_line(line))
        counts.pop(EOS, None)
        counts.pop(UNK, None)
        words = sorted(counts, key=lambda t: (-counts[t], t))
        if max_size is not None:
            words = words[: max_size - 2]
        return cls([EOS, UNK, *words])

    # ------------------------------------------------------------------ lookups
    def __len__(self) -> int:
        return len(self._tokens)

    def __contains__(self, token: object) -> bool:
        return token in self._index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self._tokens == other._tokens

    def __repr__(self) -> str:
        return f"Vocab({len(self)} tokens)"

    @property
    def tokens(self) -> list[str]:
        """A copy of the token list (position = id)."""
        return list(self._tokens)

    def id(self, token: str) -> int:
        """The id of ``token``, or the ``<unk>`` id for tokens not in the vocabulary."""
        return self._index.get(token, UNK_ID)

    def token(self, idx: int) -> str:
        """The token with id ``idx``."""
        return self._tokens[idx]

    # ------------------------------------------------------------------ encoding
    def encode_lines(self, lines: Iterable[str]) -> np.ndarray:
        """Turn text lines into one int32 id stream: each non-blank line's tokens then ``<eos>``.

        Unknown tokens become ``<unk>``. Lines that are empty after stripping produce nothing
        (the WikiText convention), so blank separators do not flood the stream with ``<eos>``.
        """
        get = self._index.get
        ids: list[int] = []
        extend = ids.extend
        append = ids.append
        for line in lines:
            words = tokenize_line(line)
            if not words:
                continue
            extend([get(w, UNK_ID) for w in words])
            append(EOS_ID)
        return np.asarray(ids, dtype=np.int32)

    def decode(self, ids: Iterable[int]) -> list[str]:
        """The tokens of an id sequence (for inspection and samples)."""
        toks = self._tokens
        return [toks[int(i)] for i in ids]

    # ------------------------------------------------------------------ files
    def to_json(self, path: str | os.PathLike) -> None:
        """Write the vocabulary to ``path`` as JSON (atomically: temp file then rename)."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
        payload = {"format": _FORMAT, "version": _VERSION, "tokens": self._tokens}
        try:
            tmp.write_text(json.dumps(payload, ensure_ascii=False), encoding="utf-8")
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise DataError(
                f"cannot write vocabulary file {path}: {exc}",
                "check that the directory exists and is writable (data.cache_dir)",
            ) from exc

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> Vocab:
        """Load a vocabulary written by :meth:`to_json`."""
        path = Path(path)
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise DataError(
                f"vocabulary file {path} does not exist", "check the path, or rebuild the cache"
            ) from exc
        except (OSError, ValueError) as exc:
            raise DataError(
                f"cannot read vocabulary file {path}: {exc}",
                "the file is damaged; delete it (or the whole data cache directory) to rebuild it",
            ) from exc
        if (
            not isinstance(payload, dict)
            or payload.get("format") != _FORMAT
            or not isinstance(payload.get("tokens"), list)
        ):
            raise DataError(
                f"{path} is not an exatrain vocabulary file",
                "delete it (or the whole data cache directory) to rebuild it",
            )
        return cls(payload["tokens"])
