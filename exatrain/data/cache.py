"""On-disk cache of tokenised corpora: memory-mapped ``.npy`` splits plus ``vocab.json``.

Layout: ``CACHE_DIR/<kind>-<key>/{train,valid,test}.npy, vocab.json, meta.json, done`` where ``key``
hashes the corpus kind, the source files (path, size, mtime), the options and :data:`FORMAT_VERSION`;
editing a source file or changing an option therefore makes a new entry instead of serving stale data.

Safe without a barrier when many ranks (processes on several nodes sharing a filesystem) build the
same entry at once: each writer fills its own uniquely named temporary directory next to the entry,
writes the ``done`` marker last, then renames the whole directory into place. ``rename`` of a
directory onto an existing non-empty one fails atomically, so the first writer wins, later writers
discard their copy, and no file a reader has open is ever replaced. Readers use an entry only if its
``done`` marker exists. The cost of no coordination is that simultaneous first runs tokenise once per
rank; later runs only memory-map.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import socket
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from exatrain.data.corpus import Corpus
from exatrain.data.vocab import Vocab
from exatrain.errors import DataError

FORMAT_VERSION = 1
DONE = "done"


def cache_key(kind: str, sources: Iterable[str | os.PathLike], options: dict[str, Any]) -> str:
    """A short hex digest identifying a tokenised corpus: kind, source files' path/size/mtime, options,
    format."""
    files = []
    for src in sources:
        p = Path(src).expanduser().resolve()
        try:
            st = p.stat()
        except OSError as exc:
            raise DataError(
                f"cannot stat data file {p}: {exc.strerror or exc}", "check that it exists and is readable"
            ) from exc
        files.append([str(p), st.st_size, st.st_mtime_ns])
    blob = json.dumps(
        {"kind": kind, "format": FORMAT_VERSION, "files": sorted(files), "options": options},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def entry_dir(cache_dir: str | os.PathLike, kind: str, key: str) -> Path:
    """The directory of one cache entry."""
    return Path(cache_dir).expanduser() / f"{kind}-{key}"


def read_entry(path: str | os.PathLike) -> Corpus | None:
    """Load a complete cache entry (splits memory-mapped read-only), or None if it is absent or unfinished."""
    path = Path(path)
    if not (path / DONE).is_file():
        return None
    try:
        meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
        splits = {name: np.load(path / f"{name}.npy", mmap_mode="r") for name in meta["splits"]}
        vocab = Vocab.from_json(path / "vocab.json")
    except (OSError, ValueError, KeyError, DataError) as exc:
        raise DataError(
            f"data cache entry {path} is damaged: {exc}",
            f"delete the directory {path} (it is rebuilt on the next run)",
        ) from exc
    return Corpus(name=meta["name"], vocab=vocab, splits=splits, meta=meta.get("meta", {}))


def write_entry(path: str | os.PathLike, corpus: Corpus) -> Path:
    """Write ``corpus`` as the cache entry ``path`` (atomic; first writer wins) and return ``path``."""
    path = Path(path)
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(
            f"cannot create data cache directory {parent}: {exc.strerror or exc}",
            "set data.cache_dir to a writable directory on a filesystem shared by all nodes",
        ) from exc
    tmp = parent / f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        for name, arr in corpus.splits.items():
            np.save(tmp / f"{name}.npy", np.ascontiguousarray(arr, dtype=np.int32))
        corpus.vocab.to_json(tmp / "vocab.json")
        meta = {
            "format": FORMAT_VERSION,
            "name": corpus.name,
            "splits": list(corpus.splits),
            "meta": corpus.meta,
        }
        (tmp / "meta.json").write_text(json.dumps(meta, default=str), encoding="utf-8")
        (tmp / DONE).write_text("ok\n", encoding="utf-8")
        _publish(tmp, path)
    except OSError as exc:
        raise DataError(
            f"cannot write data cache entry {path}: {exc.strerror or exc}",
            "set data.cache_dir to a writable directory with free space, shared by all nodes",
        ) from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def _publish(tmp: Path, path: Path) -> None:
    """Rename ``tmp`` to ``path`` unless a complete entry is already there; replace an incomplete one."""
    for _ in range(5):
        try:
            os.rename(tmp, path)
            return
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR):
                raise
        if (path / DONE).is_file():
            return  # another writer won; ours is discarded by the caller
        # An unfinished leftover (e.g. copied or half-deleted by hand): move it aside, then retry.
        trash = path.parent / f".{path.name}.stale-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            continue
        shutil.rmtree(trash, ignore_errors=True)
    raise OSError(errno.EEXIST, f"could not publish cache entry {path} after several attempts")


def cached_corpus(
    cache_dir: str | os.PathLike | None,
    kind: str,
    sources: Iterable[str | os.PathLike],
    options: dict[str, Any],
    build: Callable[[], Corpus],
) -> Corpus:
    """Return the cached corpus for (kind, sources, options), building and caching it with ``build()`` if
    needed.

    With ``cache_dir`` None or empty, just call ``build()``. The result of a cache hit or a fresh build
    is always read back from the cache, so every rank gets identical, memory-mapped arrays.
    """
    if not cache_dir:
        return build()
    path = entry_dir(cache_dir, kind, cache_key(kind, sources, options))
    hit = read_entry(path)
    if hit is not None:
        return hit
    write_entry(path, build())
    corpus = read_entry(path)
    if corpus is None:  # pragma: no cover - only if someone deletes the entry between write and read
        raise DataError(
            f"data cache entry {path} vanished right after it was written",
            "run again; check for cleanup jobs",
        )
    return corpus
