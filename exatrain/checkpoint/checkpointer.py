"""`exatrain.Checkpointer`: exatrain's whole-state checkpoints for a user's own training loop.

A thin layer over CheckpointManager (DCP, atomic commit, keep K, async saves, resharding across world
sizes and layouts) and TrainingState (model, optimizer, scheduler, per-rank RNG), plus the loader's
position and a dict of the caller's own values. `.step(n)` is the reference trainer's end of a step:
save when due, and on the pre-timeout signal checkpoint, requeue the SLURM job and exit.
"""

from __future__ import annotations

import pickle
import time
from pathlib import Path

from torch.nn.parallel import DistributedDataParallel

from exatrain.checkpoint.manager import CheckpointManager
from exatrain.checkpoint.preemption import PreemptionFlag, handled_signals, request_requeue
from exatrain.checkpoint.state import TrainingState
from exatrain.checkpoint.store import latest
from exatrain.distributed.collectives import all_gather_objects, is_root, print0
from exatrain.distributed.seed import rank_seed, seed_everything
from exatrain.errors import ExatrainError
from exatrain.observe import heartbeat
from exatrain.slurm.requeue import EXIT_REQUEUE, requeue_job

OUTPUT_GRACE_S = 1.0  # between the requeue message and `scontrol requeue`

_MISMATCH_HINT = (
    "build the same model (same class and sizes) as the run that wrote the checkpoint, or start "
    "fresh with another run_dir (or pass resume='' to ignore existing checkpoints)"
)


class Checkpointer:
    """Checkpoints of one run under RUN_DIR/checkpoints/step-N; every rank makes every call."""

    def __init__(
        self,
        run_dir,
        ctx,
        model,
        optimizer=None,
        scheduler=None,
        loader=None,
        extra: dict | None = None,
        interval: int = 0,
        keep: int = 3,
        async_save: bool = False,
        signals: str = "USR2,TERM",
        *,
        last_step: int | None = None,
        config: str = "",
        exit_on_signal: bool = True,
        log=print0,
        restart_hint: str = "run again to resume from this checkpoint",
        manager=None,
    ):
        self.ctx, self.loader, self.interval, self.last_step = ctx, loader, interval, last_step
        self.exit_on_signal, self.log, self.restart_hint = exit_on_signal, log, restart_hint
        self.preempted: dict | None = (
            None  # after a pre-timeout signal: step, checkpoint, requeued, exit_code
        )
        self.extra = extra if extra is not None else {}  # the caller's dict, restored in place
        self.run_dir = Path(run_dir)
        self.step_count = 0
        # `manager`: a factory (get_progress, set_progress) -> an object with CheckpointManager's methods,
        # for engines that write their own format; a DeepSpeed
        # engine gets DeepSpeed's; default: exatrain's DCP
        if manager is None:
            manager = _engine_manager(model, self.run_dir / "checkpoints", interval, keep, ctx.world_size)
        self.manager = (
            manager(self._progress, self._restore)
            if manager is not None
            else CheckpointManager(self.run_dir / "checkpoints", interval, keep, async_save)
        )
        self.manager.on_commit = lambda path: self.log(f"checkpoint {path} committed")
        plain = model.module if isinstance(model, DistributedDataParallel) else model
        self.state = TrainingState(
            plain,
            optimizer,
            scheduler,
            self._progress,
            self._restore,
            config,
            ctx.rank,
            ctx.device,
            layout=ctx.dims.describe(),
        )
        self.preemption = PreemptionFlag(handled_signals(signals, ctx.env.kind, bool(ctx.env.job_id)))
        self.resumed_from: Path | None = None

    def _progress(self) -> dict:
        # the loader's global position as plain ints (readable with weights_only=True, as the trainer's
        # sampler position always was); the caller's extra values pickled, so any keys and types load
        progress = {"step": self.step_count, "extra": pickle.dumps(self.extra)}
        if self.loader is not None:
            progress["sampler"] = self.loader.state_dict()
        return progress

    def _restore(self, progress: dict) -> None:
        self.step_count = int(progress["step"])
        self.extra.clear()
        self.extra.update(pickle.loads(progress["extra"]))
        if self.loader is not None:
            self.loader.load_state_dict(progress["sampler"])

    def resume(self, which: str = "auto", announce: bool = True) -> int:
        """Load the newest complete checkpoint ("auto"; or a step-N path; "" = none) and return the number
        of finished steps to continue from (0 when there is none). Cleans up killed saves first.
        `announce`: log "resumed from PATH at step N"."""
        path = self.manager.start(which)
        if path is None:
            return 0
        self.manager.load(path, self.state, mismatch_hint=_MISMATCH_HINT)
        self.resumed_from = path
        if not self.state.rng.restored:  # written under another layout: reseed each rank deterministically
            seed_everything(rank_seed(self.ctx.seed, self.ctx.dp_rank) + self.step_count)
        if announce:
            self.log(f"resumed from {path} at step {self.step_count}")
        return self.step_count

    def latest(self) -> Path | None:
        """The newest complete checkpoint in RUN_DIR/checkpoints (None without one): what resume("auto")
        loads. E.g. to refuse a fresh run on top of another run's checkpoints."""
        return latest(self.manager.root)

    def step(self, n: int) -> bool:
        """After optimizer step `n` (1-based count of finished steps), on every rank: commit a finished
        background save, save when due (every `interval` steps, and at `last_step`), and on the
        pre-timeout signal checkpoint, requeue (rank 0) and exit via SystemExit (with exit_on_signal=False:
        return, with `self.preempted` set; the caller exits with its exit_code). True when it saved."""
        self.step_count = n
        heartbeat.mark("checkpoint")
        self.manager.poll(self.ctx.device)
        saved = self.interval > 0 and (n % self.interval == 0 or n == self.last_step)
        if saved:
            self.manager.save(n, self.state, blocking=False)
        if self.preemption.agreed(self.ctx.device):
            self._preempted(n, saved)
        return saved

    def save(self, n: int | None = None) -> Path:
        """Write a checkpoint of the current state now, as step `n` (default: the last step given to
        step())."""
        if n is not None:
            self.step_count = n
        heartbeat.mark("checkpoint")
        return self.manager.save(self.step_count, self.state)

    def _preempted(self, n: int, saved: bool) -> None:
        """Every rank got here at the same step: checkpoint, rank 0 requeues, every rank exits."""
        self.log(f"signal {self.preemption.received or '(on another rank)'}: checkpointing at step {n}")
        self.manager.wait()
        path = (
            self.manager.root / f"step-{n}" if saved else self.manager.save(n, self.state)
        )  # commit says so
        env = self.ctx.env
        requeued, message = False, f"not a SLURM job step: {self.restart_hint}"
        if is_root() and env.kind == "slurm" and env.job_id:
            # SLURM ends this job step as soon as the requeue is accepted: say so before asking, and give
            # srun a moment to forward the line to the job's output (lines still in flight when the step is
            # killed are lost: seen in the SLURM test cluster)
            self.log(f"requeueing SLURM job {env.job_id}; it resumes from this checkpoint")
            time.sleep(OUTPUT_GRACE_S)
            requeued, message = requeue_job(env.job_id)
        if is_root() and not requeued:  # the batch script (or `exatrain train --nproc`) requeues instead
            message = f"{message}; {request_requeue(self.run_dir, env.kind == 'torchelastic')}"
        requeued, message = all_gather_objects((requeued, message))[0]
        code = 0 if requeued else EXIT_REQUEUE
        self.log(message if requeued else f"{message} (exit code {code})")
        self.preempted = {"step": n, "checkpoint": str(path), "requeued": requeued, "exit_code": code}
        self.close()
        if self.exit_on_signal:
            self.ctx.close()
            raise SystemExit(code)

    def wait(self) -> None:
        """Wait for a background save (if one is in flight) and commit it; raises its error."""
        self.manager.wait()

    def close(self) -> None:
        """Wait for (and commit) a background save; put the previous signal handlers back."""
        self.manager.wait()
        self.manager.finish_pruning()
        self.preemption.restore()


#: (is_engine(model), factory(root, interval, keep, model, world_size) -> manager factory): registered by an
#: outside engine's package (engines/deepspeed/checkpoints.py) when it is imported, so this layer never
#: imports the engines above it
_ENGINE_MANAGERS: list[tuple] = []


def register_manager(is_engine, factory) -> None:
    """Let `Checkpointer(model=...)` write checkpoints in an engine's own format when `is_engine(model)`:
    `factory(root, interval, keep, model, world_size)` returns the manager factory (see `manager`)."""
    _ENGINE_MANAGERS.append((is_engine, factory))


def _engine_manager(model, root: Path, interval: int, keep: int, world_size: int):
    """The manager factory of the registered engine that `model` belongs to, or None (exatrain's DCP)."""
    for is_engine, factory in _ENGINE_MANAGERS:
        if is_engine(model):
            return factory(root, interval, keep, model, world_size)
    if type(model).__module__.startswith("deepspeed."):
        raise ExatrainError(
            f"Checkpointer got a DeepSpeed engine ({type(model).__name__}) but exatrain's DeepSpeed "
            "support was not set up in this process",
            "call exatrain.init_deepspeed() (or exatrain.attach_deepspeed(ctx)) before "
            "deepspeed.initialize, as examples/deepspeed_own/train.py does",
        )
    return None
