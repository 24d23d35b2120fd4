"""The trainer: build the model and data for this rank, run the loop, evaluate, save. Kept short."""

from __future__ import annotations

import hashlib
import math
import time
from pathlib import Path

import numpy as np
import torch
from torch.distributed.tensor import DTensor

import exatrain
from exatrain.config import Config, to_toml
from exatrain.data import Corpus, eval_batches, make_batch, num_windows
from exatrain.engines.optim import build_optimizer, build_scheduler
from exatrain.env.devices import describe_devices
from exatrain.models import configured_shape
from exatrain.observe import ProgressReporter, write_json
from exatrain.observe.digest import DIGEST_MOD, samples_digest
from exatrain.observe.flops import transformer_flops_per_token
from exatrain.observe.gpu_monitor import GpuMonitor
from exatrain.observe.metrics import MetricsFanout
from exatrain.observe.profiler import StepProfiler
from exatrain.observe.tensorboard import TensorBoardLog, wants_tensorboard
from exatrain.train.build import build_engine


class Trainer:
    """Training of the reference LM on one rank of a job (or alone), in any parallel layout.

    The layout (ParallelDims) decides the engine that runs forward/backward (see
    train/data_parallel_engine.py); data is split over the data-parallel ranks only (tensor-parallel ranks of
    one group see the same batch).
    """

    def __init__(self, cfg: Config, ctx, corpus: Corpus, dims: exatrain.ParallelDims | None = None):
        """`ctx`: the Context of exatrain.init() (or a DistContext of init_distributed plus `dims`)."""
        if not isinstance(ctx, exatrain.Context):
            ctx = exatrain.Context(ctx, dims or _layout(cfg, ctx), cfg.train.seed)
        self.cfg, self.ctx, self.corpus = cfg, ctx, corpus
        self.dims = ctx.dims
        self.run_dir = Path(cfg.run.dir)
        self.dp_rank, self.dp_size = self.dims.coordinate("dp"), self.dims.dp
        dp_mesh = self.dims.mesh("dp")
        self.dp_group = dp_mesh.get_group() if dp_mesh is not None else None
        self._init_data()
        self.dtype = _autocast_dtype(cfg.train.precision, ctx.device)
        self.engine = build_engine(cfg, self.dims, ctx, corpus.vocab_size, self._autocast)
        self.model = self.engine.model_parts[0]
        # ranks of one data-parallel replica (TP, PP) draw the same dropout masks; replicas differ
        ctx.reseed()
        if self.engine.steps_optimizer:  # DeepSpeed: its engine owns optimizer and schedule
            self.optimizer, self.scheduler = self.engine.optimizer, self.engine.scheduler
        else:
            self.optimizer = build_optimizer(self.engine.model_parts, cfg.train)
            self.scheduler = build_scheduler(self.optimizer, cfg.train)
        self.step = 0
        self.progress_values = {"tokens_seen": 0, "best_eval": math.inf}  # checkpointed with the step
        self.grad_norm = None  # of the whole model before clipping, the same on every rank
        self.progress = ProgressReporter(
            cfg.train.steps,
            enabled=ctx.is_root,
            log_every=cfg.train.log_every,
            straggler_ratio=cfg.observe.straggler_ratio,
        )
        resume = self._init_checkpoints()
        self.metrics = MetricsFanout(
            exatrain.MetricsLog(
                self.run_dir / "metrics.jsonl",
                enabled=ctx.is_root,
                resume_step=self.step if resume is not None else None,
            ),
            TensorBoardLog(
                self.run_dir / "tensorboard",
                enabled=ctx.is_root and wants_tensorboard(cfg.observe.tensorboard),
            ),
        )
        p = cfg.profiler
        self.profiler = StepProfiler(
            p.ranks, p.steps, ctx.rank, ctx.world_size, self.run_dir, ctx.device.type, p.memory_snapshot
        )
        if resume is not None:
            self.progress.line(
                f"resumed from {resume} at step {self.step} ({self.tokens_seen:,} tokens seen)"
            )

    def _init_data(self) -> None:
        c, t = self.cfg, self.cfg.train
        self.train_tokens = self.corpus.split(c.data.train_split)
        self.eval_tokens = self.corpus.split(c.data.eval_split)
        self.sampler = exatrain.GlobalBatchSampler(
            num_samples=num_windows(len(self.train_tokens), c.data.seq_len),
            global_batch=t.global_batch_size,
            rank=self.dp_rank,
            world_size=self.dp_size,
            micro_batch=t.micro_batch_size,
            seed=t.seed,
        )
        self.steps_iter = self.sampler.iter_steps()  # this rank's micro-batch indices per step, across epochs
        self.accum = self.sampler.accumulation_steps

    def _init_checkpoints(self):
        """Set up checkpointing and resume if asked (or after a restart); returns the path resumed from."""
        c = self.cfg.checkpoint
        # a DeepSpeed engine is checkpointed by DeepSpeed's own save/load (ZeRO shards) in the same run layout
        model = self.engine.checkpoint_model() or self.model
        self.checkpointer = exatrain.Checkpointer(
            self.run_dir,
            self.ctx,
            model=model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            loader=self.sampler,
            extra=self.progress_values,
            interval=c.interval,
            keep=c.keep,
            async_save=c.async_save,
            signals=c.signals,
            last_step=self.cfg.train.steps,
            config=to_toml(self.cfg),
            exit_on_signal=False,
            log=self.progress.line,
            restart_hint="restart with --checkpoint.resume=auto",
        )
        # a restarted job (torchrun's agent after a worker died, or a SLURM requeue) continues, never restarts
        which = c.resume or ("auto" if self.ctx.env.restart_count else "")
        newest = self.checkpointer.latest()
        if not which and newest is not None:
            # a fresh run here would mix its checkpoints with the old run's (keep-K prunes by step number, and
            # a later resume=auto would pick the old run's newest): refuse before anything is written
            raise exatrain.ExatrainError(
                f"run.dir {self.run_dir} already holds checkpoints of another run (newest: {newest.name}) "
                "and checkpoint.resume is empty, so this run would start fresh on top of them",
                "continue that run with --checkpoint.resume=auto, or start this one in another "
                "--run.dir (or delete the old checkpoints folder)",
            )
        self.step = self.checkpointer.resume(which, announce=False)
        return self.checkpointer.resumed_from

    # what the checkpoint benchmarks drive directly: the CheckpointManager and the TrainingState
    checkpoints = property(lambda self: self.checkpointer.manager)
    state = property(lambda self: self.checkpointer.state)
    tokens_seen = property(lambda self: self.progress_values["tokens_seen"])
    best_eval = property(lambda self: self.progress_values["best_eval"])

    def _autocast(self):
        enabled = self.dtype is not None
        return torch.autocast(self.ctx.device.type, dtype=self.dtype or torch.float32, enabled=enabled)

    def train_step(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """One optimizer step over this rank's micro-batches; returns the rank's mean loss (detached).

        The engine accumulates gradients and synchronises them once per step (after the last micro-batch).
        """
        loss = self.engine.train_step(micro_batches)
        self._optimizer_step()
        return loss

    def _optimizer_step(self) -> None:
        """Clip the gradients (if set), step the optimizer and the schedule, clear the gradients (DeepSpeed's
        engine did all of that in its train_step)."""
        if self.engine.steps_optimizer:
            self.grad_norm = self.engine.grad_norm if self.cfg.train.grad_clip > 0 else None
            return
        if self.cfg.train.grad_clip > 0:
            # the whole model's norm: over DTensors of every mesh and across pipeline stages (ctx's pp mesh)
            self.grad_norm = exatrain.clip_grad_norm_(
                self.engine.model_parts, self.cfg.train.grad_clip, self.ctx
            )
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _step_metrics(self) -> exatrain.StepMetrics:
        """Step metrics over all ranks, logged every train.log_every steps; MFU from 6 N + 12 L D T."""
        c = self.cfg
        shape = configured_shape(c.model)
        matmul_params = self.engine.num_params - (self.corpus.vocab_size + c.data.seq_len) * shape.dim
        fpt = transformer_flops_per_token(matmul_params, shape.n_layers, shape.dim, c.data.seq_len)
        return exatrain.StepMetrics(
            c.train.log_every,
            self.ctx.device,
            flops_per_token=fpt,
            last_step=c.train.steps,
            start_step=self.step,
            straggler_ratio=c.observe.straggler_ratio,
            straggler_intervals=c.observe.straggler_intervals,
        )

    def _record_train(self, record: dict) -> None:
        """Write one log step's record (metrics.jsonl, TensorBoard) and show it (progress bar or line)."""
        lr = self.scheduler.get_last_lr()[0]
        norm = {} if self.grad_norm is None else {"grad_norm": self.grad_norm.item()}
        # the logged step's global batch, as the data-parallel ranks really consumed it (exact in float64)
        digest = int(self._sum_over_dp([float(self.batch_digest)])[0]) % DIGEST_MOD
        self.metrics.write(kind="train", **record, lr=lr, **norm, batch_digest=digest)
        self.progress.step(self.step, record["loss"], lr, record["tokens_per_s"], record)

    def _start_monitor(self) -> GpuMonitor | None:
        """The GPU sampler of this node, on its local rank 0 (observe.monitor_interval_s > 0)."""
        interval = self.cfg.observe.monitor_interval_s
        if interval <= 0 or self.ctx.env.local_rank != 0:
            return None
        return GpuMonitor(self.run_dir, interval).start()

    def _stop_observing(self, monitor: GpuMonitor | None) -> None:
        """Close the metric logs and the profiler; stop the GPU sampler and print its summary (one line per
        GPU of this node, by its monitoring rank)."""
        self.metrics.close()
        self.profiler.close()
        if monitor is not None:
            for line in monitor.stop():
                print(line, flush=True)

    def _watch_hangs(self):
        """The hang watcher of run.hang_timeout_s (None when 0, derived from the steps when -1): see
        docs/hangs.md."""
        timeout = self.cfg.run.hang_timeout_s
        if timeout == 0:
            return None
        return exatrain.watch_hangs(self.ctx, self.run_dir, "auto" if timeout < 0 else timeout)

    @staticmethod
    def _stop_watching(watcher) -> None:
        if watcher is not None:
            watcher.stop()

    def _micro_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        indices = next(self.steps_iter)
        batches = [make_batch(self.train_tokens, idx, self.cfg.data.seq_len) for idx in indices]
        self.batch_digest = samples_digest(x for x, _ in batches)  # what this rank really consumes
        return [self._to_device(b) for b in batches]

    def _to_device(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(t.to(self.ctx.device, non_blocking=True) for t in batch)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean token loss and perplexity on the eval split, over all ranks' shares of it."""
        self.engine.train(False)
        loss_sum, count = 0.0, 0
        for batch in eval_batches(
            self.eval_tokens,
            self.cfg.data.seq_len,
            self.cfg.train.micro_batch_size,
            self.dp_rank,
            self.dp_size,
            max_total_batches=self.cfg.train.eval_batches or None,
        ):
            x, y = self._to_device(batch)
            loss_sum += self.engine.eval_loss(x, y) * y.numel()
            count += y.numel()
        self.engine.train(True)
        loss_sum, count = self._sum_over_dp([loss_sum, float(count)])
        loss = loss_sum / max(count, 1.0)
        return {"loss": loss, "perplexity": math.exp(min(loss, 50.0))}

    def _sum_over_dp(self, values: list[float]) -> list[float]:
        """Sum over the data-parallel ranks only: TP ranks of one replica hold the same values already."""
        if self.dp_group is None:
            return list(values)
        return exatrain.sum_across_ranks(values, self.ctx.device, group=self.dp_group)

    def _record_eval(self) -> dict[str, float]:
        result = self.evaluate()
        self.metrics.write(kind="eval", step=self.step, **result)
        self.progress.line(
            f"eval  step {self.step:>6} | loss {result['loss']:.4f} | perplexity {result['perplexity']:.2f}"
        )
        if self.step > 0 and result["loss"] < self.best_eval:
            self.progress_values["best_eval"] = result["loss"]
            if self.cfg.train.save_model:
                exatrain.save0(self.engine.full_state_dict(), self.run_dir / "best.pt")
        return result

    def fit(self) -> dict:
        """Train for `train.steps` steps with periodic evaluation; returns the run summary."""
        t = self.cfg.train
        tokens_per_step = t.global_batch_size * self.cfg.data.seq_len
        if self.ctx.is_root:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.toml").write_text(to_toml(self.cfg))
        self.progress.line(self._banner())
        if self.step >= t.steps:
            self.progress.line(
                f"the run is already complete: its checkpoint is at step {self.step} and train.steps is "
                f"{t.steps}, so there is nothing to train. To continue it, raise the step count, e.g. "
                f"--train.steps={self.step + max(t.steps // 2, 1)} --checkpoint.resume=auto"
            )
        initial = self._record_eval() if t.eval_at_start and self.step == 0 else None
        start, first_step = time.perf_counter(), self.step
        timer, monitor = self._step_metrics(), self._start_monitor()
        watcher = self._watch_hangs()
        try:  # a watcher left running in a process that goes on would later take it for hung
            preempted = self._train_steps(timer, tokens_per_step)
        finally:
            self._stop_watching(watcher)
        if preempted:
            self.progress.close()
            self._stop_observing(monitor)
            return preempted
        self.checkpointer.wait()
        elapsed = time.perf_counter() - start
        last = self._record_eval()
        self._stop_observing(monitor)
        self.progress.close()
        self.checkpointer.close()
        return self._finish(initial, last, elapsed, self.step - first_step, tokens_per_step)

    def _train_steps(self, timer, tokens_per_step: int) -> dict | None:
        """The training loop up to train.steps; a dict when a pre-timeout signal stopped it (checkpointed and
        requeued by rank 0), else None."""
        t = self.cfg.train
        while self.step < t.steps:
            exatrain.step(self.step + 1)  # the hang watcher's progress mark (an attribute update, no sync)
            self.profiler.begin(self.step + 1)
            with timer.phase("data"):
                batches = self._micro_batches()
            with timer.phase("forward_backward"):
                local = self.engine.train_step(batches)
            with timer.phase("optimizer"):
                self._optimizer_step()
            timer.add_loss(local)  # stays on the device until a log step
            self.step += 1
            self.progress_values["tokens_seen"] += tokens_per_step
            self.profiler.end(self.step)
            record = timer.end_step(
                tokens=tokens_per_step / self.ctx.world_size,
                samples=t.global_batch_size / self.ctx.world_size,
            )
            if record is not None:
                self._record_train(record)
            if t.eval_every and self.step % t.eval_every == 0 and self.step < t.steps:
                with timer.paused():  # throughput counts training time only
                    self._record_eval()
            # saves when due; on a pre-timeout signal: checkpoint and requeue (rank 0), then we stop here
            with timer.phase("checkpoint"):
                self.checkpointer.step(self.step)
            if self.checkpointer.preempted:
                return {"preempted": True, **self.checkpointer.preempted}
        return None

    def _finish(self, initial, final, elapsed: float, steps_trained: int, tokens_per_step: int) -> dict:
        if self.cfg.train.save_model:
            exatrain.save0(self.engine.full_state_dict(), self.run_dir / "final.pt")
        digest = weights_digest(self.engine.model_parts)
        # ranks that must hold identical weights: same place in every dimension but dp_replicate
        replicas = exatrain.all_gather_objects(
            (self.dims.coordinate("pp"), self.dims.coordinate("dp_shard"), self.dims.coordinate("tp"), digest)
        )
        env = self.ctx.env
        write_json(
            self.run_dir / "ranks" / f"rank-{self.ctx.rank}.json",
            {
                **env.to_dict(),
                "device": str(self.ctx.device),
                "backend": self.ctx.backend,
                # the GPU this rank's visibility variables select
                # (what SLURM bound), also on CPU-only torch builds
                "gpu": describe_devices(env.local_rank, env.local_world_size),
                "weights_sha256": digest,
            },
        )
        summary = {
            "steps": self.step,
            "world_size": self.ctx.world_size,
            "model_size": self.cfg.model.size,
            "layout": self.dims.describe(),
            "parameters": self.engine.num_params,
            "initial_eval": initial,
            "final_eval": final,
            "best_eval_loss": self.best_eval,
            "train_seconds": elapsed,
            "steps_trained": steps_trained,  # by this run (0: resumed at or past train.steps)
            "tokens_per_s": steps_trained * tokens_per_step / max(elapsed, 1e-9),
            "tokens_seen": self.tokens_seen,
            "weights_in_sync": replicas_agree(replicas),
        }
        if self.ctx.is_root:
            write_json(self.run_dir / "summary.json", summary)
            self.progress.line(_summary_line(summary))
        return summary

    def _layout_name(self) -> str:
        e = self.cfg.engine
        if e.name == "deepspeed":
            return (
                f"DeepSpeed ZeRO-{e.zero_stage} over {self.dp_size} rank(s) (DeepSpeed accelerator "
                f"{self.engine.accelerator})"
            )
        if e.name == "horovod":
            return f"Horovod over {self.dp_size} rank(s)"
        return self.dims.describe()

    def _banner(self) -> str:
        c, t = self.cfg, self.cfg.train
        return (
            f"exatrain: model {c.model.size} ({self.engine.num_params / 1e6:.2f}M params), data "
            f"{c.data.kind} "
            f"(vocab {len(self.corpus.vocab)}, {len(self.train_tokens):,} train tokens), "
            f"{self.ctx.world_size} rank(s) on {self.ctx.device.type} "
            f"({self.ctx.backend or 'no process group'}), "
            f"layout {self._layout_name()}, global batch {t.global_batch_size} = {t.micro_batch_size} x "
            f"{self.accum} accum x {self.dp_size} data-parallel ranks, {t.steps} steps -> {self.run_dir}"
        )


def _summary_line(s: dict) -> str:
    """The closing line: steps, time and throughput, or that nothing was trained (a complete run resumed)."""
    start = f"{s['initial_eval']['perplexity']:.2f} -> " if s["initial_eval"] else ""
    if s["steps_trained"]:
        trained = f"{s['steps']} steps in {s['train_seconds']:.1f} s ({s['tokens_per_s']:,.0f} tok/s)"
    else:
        trained = f"nothing trained (the run was already complete at step {s['steps']})"
    return (
        f"done: {trained}; validation perplexity {start}{s['final_eval']['perplexity']:.2f}; "
        f"weights in sync on {s['world_size']} rank(s): {'yes' if s['weights_in_sync'] else 'NO'}"
    )


def _autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return {"bf16": torch.bfloat16, "fp32": None}[precision]


def weights_digest(model_parts) -> str:
    """SHA-256 over this rank's own weights (its shards of sharded parameters) in name order: equal digests
    on two replicas mean bit-identical weights."""
    h = hashlib.sha256()
    for i, part in enumerate(model_parts):
        for name, p in sorted(part.state_dict().items()):
            local = p.to_local() if isinstance(p, DTensor) else p  # this rank's shard
            h.update(f"{i}.{name}".encode())
            h.update(np.ascontiguousarray(local.detach().float().cpu().numpy()).tobytes())
    return h.hexdigest()


def replicas_agree(entries: list[tuple]) -> bool:
    """Given every rank's (place..., digest), True when ranks at the same place hold the same digest."""
    seen: dict[tuple, str] = {}
    return all(seen.setdefault(tuple(e[:-1]), e[-1]) == e[-1] for e in entries)


def _layout(cfg: Config, ctx) -> exatrain.ParallelDims:
    """The layout from the configuration, with its device mesh (for callers that did not run preflight)."""
    dims = exatrain.ParallelDims.from_config(cfg.parallel, ctx.world_size)
    dims.build_mesh(ctx.device.type)
    return dims
