"""Save and restore the training state on every rank, with atomic commit and retention."""

from __future__ import annotations

import contextlib
import threading
import warnings
from concurrent.futures import Future
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from exatrain.checkpoint.compatibility import (
    checkpoint_model_shapes,
    model_shapes,
    read_metadata,
    require_shapes,
)
from exatrain.checkpoint.state import TrainingState
from exatrain.checkpoint.store import (
    clean_incomplete,
    commit,
    delete,
    partial_dir,
    resolve_resume,
    retire,
    step_dir,
)
from exatrain.checkpoint.writer import checkpoint_writer
from exatrain.distributed import all_gather_objects, all_ranks, any_rank, barrier, is_root
from exatrain.errors import ExatrainError

# DCP reports failures as CheckpointException, which derives from BaseException, not Exception.
_FAILURES = (Exception, CheckpointException)

# DCP warns on every call without a process group (also from its background thread); a single-process
# run is intended here.
warnings.filterwarnings("ignore", message="torch.distributed is disabled")


class CheckpointManager:
    """Checkpoints of one run under RUN_DIR/checkpoints; every rank calls every method."""

    def __init__(self, root: Path, interval: int, keep: int, async_save: bool = False, on_commit=None):
        self.root, self.interval, self.keep, self.async_save = Path(root), interval, keep, async_save
        self.on_commit = (
            on_commit  # called on rank 0 with each committed checkpoint's path (say so in the output)
        )
        self.resumed_from: Path | None = None
        self.pending: tuple[Future, int] | None = None  # the one background save allowed in flight
        # A background save runs collectives from its own thread: on the training group they would
        # interleave with the training step's collectives and deadlock, so it gets a group of its own.
        self.group = dist.new_group(backend="gloo") if async_save and dist.is_initialized() else None
        # The in-memory copy of the state is also made in the background (into buffers kept between saves);
        # the optimizer's next step, which changes the state, waits for it (see _guard).
        self.stager = (
            DefaultStager(
                StagingOptions(
                    use_pinned_memory=False,
                    use_shared_memory=False,
                    use_async_staging=True,
                    use_non_blocking_copy=False,
                )
            )
            if async_save
            else None
        )
        self.staging: Future | None = None
        self._guarded: set[int] = set()  # ids of the optimizers whose step waits for the copy
        self.pruning: threading.Thread | None = (
            None  # rank 0: deletes the checkpoints retired by the last commit
        )

    def start(self, resume: str) -> Path | None:
        """Clean leftovers of killed saves (rank 0), then pick the checkpoint to resume from, if any."""
        if is_root():
            self.root.mkdir(parents=True, exist_ok=True)
            clean_incomplete(self.root)
        barrier()
        self.resumed_from = resolve_resume(resume, self.root)
        return self.resumed_from

    def save(self, step: int, state: TrainingState, blocking: bool = True) -> Path:
        """Write step-N; all ranks write, then rank 0 commits and prunes old ones.

        With async saving and `blocking=False`, background threads copy the state in memory (the optimizer's
        next step waits for that copy) and write it while training goes on; `poll()` commits it once every
        rank finished.
        """
        self.wait()  # at most one save in flight; a failed one is reported here
        partial = partial_dir(self.root, step)
        try:
            writer = checkpoint_writer(partial, step)
            if self.async_save and not blocking:
                response = dcp.async_save(
                    state.entries(),
                    storage_writer=writer,
                    planner=self._planner(),
                    process_group=self.group,
                    async_stager=self.stager,
                )
                self._guard(state.optimizer)
                self.staging, self.pending = response.staging_completion, (response.upload_completion, step)
                return step_dir(self.root, step)
            dcp.save(state.entries(), storage_writer=writer, planner=self._planner())
        except _FAILURES as e:  # DCP gathers every rank's failure, so all ranks raise together
            raise _save_failed(step, partial, _reason(e)) from None
        return self._commit(step)

    def _planner(self) -> DefaultSavePlanner:
        """DCP's planner, reusing the previous save's plan when no rank's local plan changed.

        Every save of a run has the same tensors, so the coordinator's gathering, deduplication and scattering
        of all ranks' plans (pickled lists of hundreds of items) is repeated work. DCP keeps the plans in
        class-level caches under `_cached_plans_key`; a key per checkpoint folder keeps managers apart that
        share a process (tests, benchmarks). A rank whose plan changed sends it again and the coordinator
        rebuilds the global plan, so a change of the state is never missed.
        """
        planner = DefaultSavePlanner(enable_plan_caching=True)
        planner._cached_plans_key = f"exatrain:{self.root.resolve()}"
        return planner

    def _guard(self, optimizer) -> None:
        """Make every later `optimizer.step()` first wait until the background copy of the state is
        complete."""
        if id(optimizer) not in self._guarded:
            optimizer.register_step_pre_hook(lambda *_: self._staged())
            self._guarded.add(id(optimizer))

    def _staged(self) -> None:
        """Wait for the background copy of the state, if one is running."""
        staging, self.staging = self.staging, None
        if staging is not None:
            with contextlib.suppress(*_FAILURES):  # a failed copy fails the upload too, reported by wait()
                staging.result()

    def _commit(self, step: int) -> Path:
        """Once every rank has written: rank 0 commits step-N and prunes old checkpoints in the background.

        No barrier is needed before the commit: DCP's save ends with a gather of every rank's write results
        to rank 0 (which then writes .metadata), so rank 0 gets here only after all ranks' files are written
        and fsync'ed; `wait()` also runs a collective after the background write before calling this.
        """
        if is_root():
            commit(partial_dir(self.root, step), step_dir(self.root, step))
            if self.on_commit is not None:
                self.on_commit(step_dir(self.root, step))
            self.finish_pruning()
            retired = retire(self.root, self.keep, protect=self.resumed_from)
            # Unlinking a checkpoint is slow on some file systems (~300 MiB: 65-125 ms on ext4 with `discard`
            # here, a third of writing it) and the save need not wait: the folders were atomically renamed
            # out of the checkpoints. Not a daemon thread: interpreter exit waits for it; a kill leaves
            # `.pruned` folders for clean_incomplete.
            if retired:
                self.pruning = threading.Thread(target=delete, args=(retired,), name="exatrain-prune")
                self.pruning.start()
        barrier()
        return step_dir(self.root, step)

    def finish_pruning(self) -> None:
        """Wait until the old checkpoints retired by the last commit are deleted (rank 0; no-op elsewhere)."""
        pruning, self.pruning = self.pruning, None
        if pruning is not None:
            pruning.join()

    def poll(self, device) -> None:
        """Collective, once per step: commit the background save when it has finished on every rank."""
        if self.pending is not None and all_ranks(self.pending[0].done(), device):
            self.wait()

    def wait(self) -> None:
        """Block until the background save (if any) is written, then commit it; errors become
        ExatrainError."""
        self._staged()
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
            raise _save_failed(
                step, partial_dir(self.root, step), error or "on another rank", background=True
            )
        self._commit(step)

    def load(self, path: Path, state: TrainingState, mismatch_hint: str | None = None) -> None:
        """Restore `state` from a committed checkpoint, after checking it fits the model (else an
        ExatrainError listing missing, unexpected and reshaped entries, with `mismatch_hint` if given)."""
        meta = read_metadata(path)
        # a pipeline stage's model holds only its own layers: compare the union over all ranks
        expected: dict[str, tuple] = {}
        for shapes in all_gather_objects(model_shapes(state.model)):
            expected.update(shapes)
        require_shapes(
            expected,
            checkpoint_model_shapes(meta),
            f"checkpoint {path}",
            **({"hint": mismatch_hint} if mismatch_hint else {}),
        )
        try:
            dcp.load(state.entries(meta.state_dict_metadata), checkpoint_id=str(path))
        except _FAILURES as e:
            raise ExatrainError(
                f"loading checkpoint {path} failed ({_reason(e)})",
                "the checkpoint may be damaged: resume from an earlier step-N folder",
            ) from None


def _reason(e: BaseException) -> str:
    """One line on what went wrong; DCP's exception wraps each failing rank's own exception."""
    prefix = ""
    failures = getattr(e, "failures", None)
    if failures:
        failed_rank, e = next(iter(failures.items()))
        prefix = f"rank {failed_rank}: "
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{prefix}{type(e).__name__}: {first[:300]}"


def _save_failed(step: int, where: Path, reason: str, background: bool = False) -> ExatrainError:
    kind = "background save" if background else "save"
    return ExatrainError(
        f"the {kind} of step {step} to {where} failed ({reason})",
        "check free space and permissions of the run directory; the previous checkpoint "
        "is intact and --checkpoint.resume=auto uses it",
    )
