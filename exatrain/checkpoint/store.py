"""Checkpoint folders: RUN_DIR/checkpoints/step-N, committed atomically, found, pruned, cleaned.

A save writes into `.step-N.partial/`; once all ranks have written (DCP's save ends with a gather of every
rank's results to rank 0), rank 0 writes the commit marker last and renames the folder to `step-N`. A
folder without the marker (a rank was killed mid-save) is never used and is removed by the next run.

Pruning first renames an old checkpoint to `.step-N.pruned` (atomic: from then on it is no checkpoint), then
deletes it, which may happen on a background thread; a run killed in between leaves a `.pruned` folder that
the next run removes.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from pathlib import Path

from exatrain.errors import ExatrainError

MARKER = "COMMITTED"
_STEP = re.compile(r"^step-(\d+)$")


def step_dir(root: Path, step: int) -> Path:
    """Where the committed checkpoint of `step` lives."""
    return root / f"step-{step}"


def partial_dir(root: Path, step: int) -> Path:
    """Where the checkpoint of `step` is written before its commit."""
    return root / f".step-{step}.partial"


#: the file every checkpoint format writes last: DCP's metadata, DeepSpeed's `latest` tag file
FORMAT_FILES = (".metadata", "latest")


def is_complete(path: Path) -> bool:
    """A checkpoint folder is usable only once its commit marker exists."""
    return (path / MARKER).is_file() and any((path / f).is_file() for f in FORMAT_FILES)


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Committed checkpoints under `root`, oldest step first."""
    found = []
    for p in root.glob("step-*") if root.is_dir() else []:
        m = _STEP.match(p.name)
        if m and is_complete(p):
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest(root: Path) -> Path | None:
    """The newest committed checkpoint, or None."""
    found = complete_checkpoints(root)
    return found[-1][1] if found else None


def commit(partial: Path, final: Path) -> None:
    """Rank 0, after every rank finished writing: marker last, then the atomic rename, made durable.

    The data files and .metadata are already fsync'ed (DCP does that). Syncing the checkpoint's folder and
    the one that holds it persists the marker's creation and the rename before anything else happens (pruning
    an older checkpoint in particular), so that a power loss never leaves fewer checkpoints than `keep`.
    """
    (partial / MARKER).write_text("complete\n")
    if final.exists():  # a re-save of the same step (e.g. after a restart): replace it
        shutil.rmtree(final)
    partial.rename(final)
    fsync_dir(final)  # the marker's entry
    fsync_dir(final.parent)  # the rename


def fsync_dir(path: Path) -> None:
    """Persist the entries of folder `path` (created, renamed or removed files); no-op where unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on a directory
        pass
    finally:
        os.close(fd)


def clean_incomplete(root: Path) -> list[Path]:
    """Remove partial folders and uncommitted step folders left by a killed save, and pruned folders whose
    deletion was cut short (rank 0 only)."""
    removed = []
    leftovers = [*root.glob(".step-*.partial"), *root.glob(".step-*.pruned")] if root.is_dir() else []
    for p in leftovers:
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    for p in root.glob("step-*") if root.is_dir() else []:
        if _STEP.match(p.name) and not is_complete(p):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def retire(root: Path, keep: int, protect: Path | None = None) -> list[Path]:
    """Pruning, first half: rename all but the newest `keep` committed checkpoints, never `protect` (the one
    resumed from), to `.step-N.pruned` (no longer checkpoints, not yet deleted); returns the new paths."""
    if keep <= 0:
        return []
    found = complete_checkpoints(root)
    doomed = [p for _, p in found[:-keep] if protect is None or p.resolve() != protect.resolve()]
    retired = []
    for old in doomed:
        new = old.with_name(f".{old.name}.pruned")
        if new.exists():  # left over from an earlier run's cut-short deletion
            shutil.rmtree(new, ignore_errors=True)
        with contextlib.suppress(OSError):  # like a failed deletion: the old checkpoint stays, no error
            old.rename(new)
            retired.append(new)
    return retired


def delete(folders: list[Path]) -> None:
    """Pruning, second half: remove retired checkpoint folders (unlinking hundreds of MiB takes a while on
    some file systems)."""
    for p in folders:
        shutil.rmtree(p, ignore_errors=True)


def resolve_resume(spec: str, root: Path) -> Path | None:
    """Turn `checkpoint.resume` into a folder: "" = none, "auto" = latest committed (or none), else a path."""
    if not spec:
        return None
    if spec == "auto":
        return latest(root)
    path = Path(spec)
    if not path.is_dir():
        raise ExatrainError(
            f"checkpoint.resume={spec!r}: no such checkpoint directory",
            f"use --checkpoint.resume=auto to pick the latest in {root}, or a step-N folder there",
        )
    if not is_complete(path):
        raise ExatrainError(
            f"checkpoint {path} is incomplete (no {MARKER} marker or .metadata): its save never finished",
            "resume from an earlier step-N folder, or --checkpoint.resume=auto",
        )
    return path
