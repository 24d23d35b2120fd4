"""Save and restore the training state on every rank, with atomic commit and retention."""

from __future__ import annotations

import warnings
from concurrent.futures import Future
from pathlib import Path

import torch.distributed as dist

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from exatrain.checkpoint.checks import checkpoint_model_shapes, model_shapes, require_shapes
from exatrain.checkpoint.state import TrainingState
from exatrain.checkpoint.store import (clean_incomplete, commit, partial_dir, prune, resolve_resume, step_dir)
from exatrain.dist import all_gather_objects, all_ranks, any_rank, barrier, is_root
from exatrain.errors import ExatrainError

# DCP reports failures as CheckpointException, which derives from BaseException, not Exception.
_FAILURES = (Exception, CheckpointException)

# DCP warns on every call without a process group (also from its background thread); a single-process
# run is intended here.
warnings.filterwarnings("ignore", message="torch.distributed is disabled")


class CheckpointManager:
    """Checkpoints of one run under RUN_DIR/checkpoints; every rank calls every method."""

    def __init__(self, root: Path, interval: int, keep: int, async_save: bool = False):
        self.root, self.interval, self.keep, self.async_save = Path(root), interval, keep, async_save
        self.resumed_from: Path | None = None
        self.pending: tuple[Future, int] | None = None  # the one background save allowed in flight
        # A background save runs collectives from its own thread: on the training group they would
        # interleave with the training step's collectives and deadlock, so it gets a group of its own.
        self.group = dist.new_group(backend="gloo") if async_save and dist.is_initialized() else None

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

    def save(self, step: int, state: TrainingState, blocking: bool = True) -> Path:
        """Write step-N; all ranks write, then rank 0 commits and prunes old ones.

        With async saving and `blocking=False`, the state is staged in memory and written by a background
        thread while training goes on; `poll()` commits it once every rank finished.
        """
        self.wait()  # at most one save in flight; a failed one is reported here
        partial = partial_dir(self.root, step)
        try:
            if self.async_save and not blocking:
                future = dcp.async_save({"app": state}, checkpoint_id=str(partial), process_group=self.group)
                self.pending = (future, step)
                return step_dir(self.root, step)
            dcp.save({"app": state}, checkpoint_id=str(partial))
        except _FAILURES as e:  # DCP gathers every rank's failure, so all ranks raise together
            raise _save_failed(step, partial, _reason(e)) from None
        return self._commit(step)

    def _commit(self, step: int) -> Path:
        barrier()
        if is_root():
            commit(partial_dir(self.root, step), step_dir(self.root, step))
            prune(self.root, self.keep, protect=self.resumed_from)
        barrier()
        return step_dir(self.root, step)

    def poll(self, device) -> None:
        """Collective, once per step: commit the background save when it has finished on every rank."""
        if self.pending is not None and all_ranks(self.pending[0].done(), device):
            self.wait()

    def wait(self) -> None:
        """Block until the background save (if any) is written, then commit it; errors become ExatrainError."""
        if self.pending is None:
            return
        future, step = self.pending
        self.pending = None
        error = None
        try:
            future.result()
        except _FAILURES as e:  # the background thread's exception, re-raised here
            error = _reason(e)
        if any_rank(error is not None):
            raise _save_failed(step, partial_dir(self.root, step), error or "on another rank", background=True)
        self._commit(step)

    def load(self, path: Path, state: TrainingState) -> None:
        """Restore `state` from a committed checkpoint, after checking it fits the model."""
        # a pipeline stage's model holds only its own layers: compare the union over all ranks
        expected: dict[str, tuple] = {}
        for shapes in all_gather_objects(model_shapes(state.model)):
            expected.update(shapes)
        require_shapes(expected, checkpoint_model_shapes(path), f"checkpoint {path}")
        try:
            dcp.load({"app": state}, checkpoint_id=str(path))
        except _FAILURES as e:
            raise ExatrainError(f"loading checkpoint {path} failed ({_reason(e)})",
                                "the checkpoint may be damaged: resume from an earlier step-N folder") from None



def _reason(e: BaseException) -> str:
    """One line on what went wrong; DCP's exception wraps each failing rank's own exception."""
    prefix = ""
    failures = getattr(e, "failures", None)
    if failures:
        rank, e = next(iter(failures.items()))
        prefix = f"rank {rank}: "
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{prefix}{type(e).__name__}: {first[:300]}"


def _save_failed(step: int, where: Path, reason: str, background: bool = False) -> ExatrainError:
    kind = "background save" if background else "save"
    return ExatrainError(f"the {kind} of step {step} to {where} failed ({reason})",
                         "check free space and permissions of the run directory; the previous checkpoint "
                         "is intact and --checkpoint.resume=auto uses it")
