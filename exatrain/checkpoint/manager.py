"""Save and restore the training state on every rank, with atomic commit and retention."""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import torch.distributed.checkpoint as dcp

from exatrain.checkpoint.checks import checkpoint_model_shapes, require_match
from exatrain.checkpoint.state import TrainingState
from exatrain.checkpoint.store import (clean_incomplete, commit, partial_dir, prune, resolve_resume, step_dir)
from exatrain.dist import barrier, is_root
from exatrain.errors import ExatrainError


class CheckpointManager:
    """Checkpoints of one run under RUN_DIR/checkpoints; every rank calls every method."""

    def __init__(self, root: Path, interval: int, keep: int):
        self.root, self.interval, self.keep = Path(root), interval, keep
        self.resumed_from: Path | None = None

    def start(self, resume: str) -> Path | None:
        """Clean leftovers of killed saves (rank 0), then pick the checkpoint to resume from, if any."""
        if is_root():
            self.root.mkdir(parents=True, exist_ok=True)
            clean_incomplete(self.root)
        barrier()
        self.resumed_from = resolve_resume(resume, self.root)
        return self.resumed_from

    def due(self, step: int, last_step: int) -> bool:
        """Save after this step? Every `interval` steps, and after the last one when saving is on."""
        return self.interval > 0 and (step % self.interval == 0 or step == last_step)

    def save(self, step: int, state: TrainingState) -> Path:
        """Write step-N atomically: all ranks write, meet, then rank 0 commits and prunes old ones."""
        partial, final = partial_dir(self.root, step), step_dir(self.root, step)
        with _single_process_quiet():
            dcp.save({"app": state}, checkpoint_id=str(partial))
        barrier()
        if is_root():
            commit(partial, final)
            prune(self.root, self.keep, protect=self.resumed_from)
        barrier()
        return final

    def load(self, path: Path, state: TrainingState) -> None:
        """Restore `state` from a committed checkpoint, after checking it fits the model."""
        require_match(state.model, checkpoint_model_shapes(path), f"checkpoint {path}")
        try:
            with _single_process_quiet():
                dcp.load({"app": state}, checkpoint_id=str(path))
        except Exception as e:  # DCP wraps per-rank failures in CheckpointException
            raise ExatrainError(f"loading checkpoint {path} failed ({type(e).__name__}: {str(e)[:500]})",
                                "the checkpoint may be damaged: resume from an earlier step-N folder") from None



@contextlib.contextmanager
def _single_process_quiet():
    """DCP warns on every call without a process group; a single-process run is intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield
