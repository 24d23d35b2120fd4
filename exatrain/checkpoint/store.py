"""Checkpoint folders: RUN_DIR/checkpoints/step-N, committed atomically, found, pruned, cleaned.

A save writes into `.step-N.partial/`, all ranks meet at a barrier, then rank 0 writes the commit marker
last and renames the folder to `step-N`. A folder without the marker (a rank was killed mid-save) is never
used and is removed by the next run.
"""

from __future__ import annotations

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


def is_complete(path: Path) -> bool:
    """A checkpoint folder is usable only once its commit marker exists."""
    return (path / MARKER).is_file() and (path / ".metadata").is_file()


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
    """Rank 0, after every rank finished writing: marker last, then the atomic rename."""
    (partial / MARKER).write_text("complete\n")
    if final.exists():  # a re-save of the same step (e.g. after a restart): replace it
        shutil.rmtree(final)
    partial.rename(final)


def clean_incomplete(root: Path) -> list[Path]:
    """Remove partial folders and uncommitted step folders left by a killed save (rank 0 only)."""
    removed = []
    for p in root.glob(".step-*.partial") if root.is_dir() else []:
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    for p in root.glob("step-*") if root.is_dir() else []:
        if _STEP.match(p.name) and not is_complete(p):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def prune(root: Path, keep: int, protect: Path | None = None) -> list[Path]:
    """Delete all but the newest `keep` committed checkpoints, never `protect` (the one resumed from)."""
    if keep <= 0:
        return []
    found = complete_checkpoints(root)
    doomed = [p for _, p in found[:-keep] if protect is None or p.resolve() != protect.resolve()]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


def resolve_resume(spec: str, root: Path) -> Path | None:
    """Turn `checkpoint.resume` into a folder: "" = none, "auto" = latest committed (or none), else a path."""
    if not spec:
        return None
    if spec == "auto":
        return latest(root)
    path = Path(spec)
    if not path.is_dir():
        raise ExatrainError(f"checkpoint.resume={spec!r}: no such checkpoint directory",
                            f"use --checkpoint.resume=auto to pick the latest in {root}, or a step-N folder there")
    if not is_complete(path):
        raise ExatrainError(f"checkpoint {path} is incomplete (no {MARKER} marker or .metadata): its save never finished",
                            "resume from an earlier step-N folder, or --checkpoint.resume=auto")
    return path
