"""The trainer: build the model and data for this rank, run the loop, evaluate, save. Kept short."""

from __future__ import annotations

import hashlib
import math
import time
from pathlib import Path

import numpy as np
import torch

from exatrain.checkpoint import CheckpointManager, TrainingState
from exatrain.checkpoint.preemption import PreemptionFlag
from exatrain.config import Config, to_toml
from exatrain.data import Corpus, GlobalBatchSampler, eval_batches, make_batch, num_windows
from exatrain.distributed import DistContext, all_gather_objects, is_root, rank_seed, save0, seed_everything, sum_across_ranks
from exatrain.env.devices import describe_devices
from exatrain.distributed.grad_norm import clip_grad_norm_
from exatrain.distributed.parallel_dims import ParallelDims
from exatrain.distributed.parallelize import local_tensor
from exatrain.launch.requeue import EXIT_REQUEUE, requeue_job
from exatrain.train.build import build_engine
from exatrain.train.optim import build_optimizer, build_scheduler
from exatrain.train.progress import ProgressReporter
from exatrain.train.records import MetricsLog, write_json


class Trainer:
    """Training of the reference LM on one rank of a job (or alone), in any parallel layout.

    The layout (ParallelDims) decides the engine that runs forward/backward (see train/engine.py); data
    is split over the data-parallel ranks only (tensor-parallel ranks of one group see the same batch).
    """

    def __init__(self, cfg: Config, ctx: DistContext, corpus: Corpus, dims: ParallelDims | None = None):
        self.cfg, self.ctx, self.corpus = cfg, ctx, corpus
        self.dims = dims or _layout(cfg, ctx)
        self.run_dir = Path(cfg.run.dir)
        self.dp_rank, self.dp_size = self.dims.coordinate("dp"), self.dims.dp
        dp_mesh = self.dims.mesh("dp")
        self.dp_group = dp_mesh.get_group() if dp_mesh is not None else None
        self._init_data()
        self.dtype = _autocast_dtype(cfg.train.precision, ctx.device)
        self.engine = build_engine(cfg, self.dims, ctx, corpus.vocab_size, self._autocast)
        self.model = self.engine.model_parts[0]
        # ranks of one data-parallel replica (TP, PP) draw the same dropout masks; replicas differ
        seed_everything(rank_seed(cfg.train.seed, self.dp_rank))
        if getattr(self.engine, "steps_optimizer", False):  # DeepSpeed: its engine owns optimizer and schedule
            self.optimizer, self.scheduler = self.engine.optimizer, self.engine.scheduler
        else:
            self.optimizer = build_optimizer(self.engine.model_parts, cfg.train)
            self.scheduler = build_scheduler(self.optimizer, cfg.train)
        self.step, self.tokens_seen, self.best_eval = 0, 0, math.inf
        self.grad_norm = None  # of the whole model before clipping, the same on every rank
        resume = self._init_checkpoints()
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl", enabled=ctx.is_root,
                                  resume_step=self.step if resume is not None else None)
        self.progress = ProgressReporter(cfg.train.steps, enabled=ctx.is_root, log_every=cfg.train.log_every)
        self.preemption = PreemptionFlag(_preemption_signals(cfg.checkpoint.signals, ctx.env.kind))
        if resume is not None:
            self.progress.line(f"resumed from {resume} at step {self.step} ({self.tokens_seen:,} tokens seen)")

    def _init_data(self) -> None:
        c, t = self.cfg, self.cfg.train
        self.train_tokens = self.corpus.split(c.data.train_split)
        self.eval_tokens = self.corpus.split(c.data.eval_split)
        self.sampler = GlobalBatchSampler(
            num_samples=num_windows(len(self.train_tokens), c.data.seq_len), global_batch=t.global_batch_size,
            rank=self.dp_rank, world_size=self.dp_size, micro_batch=t.micro_batch_size, seed=t.seed,
        )
        self.steps_iter = self.sampler.iter_steps()  # this rank's micro-batch indices per step, across epochs
        self.accum = self.sampler.accumulation_steps

    def _init_checkpoints(self):
        """Set up checkpointing and resume if asked (or after a restart); returns the path resumed from."""
        c = self.cfg.checkpoint
        if getattr(self.engine, "owns_checkpoints", False):
            return self._init_engine_checkpoints()
        self.checkpoints = CheckpointManager(self.run_dir / "checkpoints", c.interval, c.keep, c.async_save)
        self.state = TrainingState(self.model, self.optimizer, self.scheduler, self._progress_state,
                                   self._restore_progress, to_toml(self.cfg), self.ctx.rank, self.ctx.device,
                                   layout=self.dims.describe())
        # a restarted job (torchrun's agent after a worker died, or a SLURM requeue) continues, never restarts
        resume = self.checkpoints.start(c.resume or ("auto" if self.ctx.env.restart_count else ""))
        if resume is not None:
            self.checkpoints.load(resume, self.state)
            if not self.state.rng.restored:  # saved under another layout: reseed deterministically
                seed_everything(rank_seed(self.cfg.train.seed, self.dp_rank) + self.step)
        return resume

    def _init_engine_checkpoints(self):
        """DeepSpeed's own save/load in the same run layout (train/deepspeed_checkpoint.py)."""
        from exatrain.train.deepspeed_checkpoint import DeepSpeedCheckpoints

        c = self.cfg.checkpoint
        self.checkpoints = DeepSpeedCheckpoints(self.run_dir / "checkpoints", c.interval, c.keep, self.engine,
                                                self._progress_state, self._restore_progress, self.ctx.world_size)
        self.state = None
        resume = self.checkpoints.start(c.resume or ("auto" if self.ctx.env.restart_count else ""))
        if resume is not None:
            self.checkpoints.load(resume)
        return resume

    def _progress_state(self) -> dict:
        return {"step": self.step, "tokens_seen": self.tokens_seen, "best_eval": self.best_eval,
                "sampler": self.sampler.state_dict()}

    def _restore_progress(self, progress: dict) -> None:
        self.step, self.tokens_seen = int(progress["step"]), int(progress["tokens_seen"])
        self.best_eval = float(progress["best_eval"])
        self.sampler.load_state_dict(progress["sampler"])  # global position: valid for any world size

    def _autocast(self):
        enabled = self.dtype is not None
        return torch.autocast(self.ctx.device.type, dtype=self.dtype or torch.float32, enabled=enabled)

    def train_step(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """One optimizer step over this rank's micro-batches; returns the rank's mean loss (detached).

        The engine accumulates gradients and synchronises them once per step (after the last micro-batch).
        """
        loss = self.engine.train_step(micro_batches)
        if getattr(self.engine, "steps_optimizer", False):
            self.grad_norm = self.engine.grad_norm if self.cfg.train.grad_clip > 0 else None
            return loss
        if self.cfg.train.grad_clip > 0:
            params = [p for part in self.engine.model_parts for p in part.parameters()]
            self.grad_norm = clip_grad_norm_(params, self.cfg.train.grad_clip, pp_mesh=self.dims.mesh("pp"))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def _micro_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        indices = next(self.steps_iter)
        return [self._to_device(make_batch(self.train_tokens, idx, self.cfg.data.seq_len)) for idx in indices]

    def _to_device(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(t.to(self.ctx.device, non_blocking=True) for t in batch)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean token loss and perplexity on the eval split, over all ranks' shares of it."""
        self.engine.train(False)
        loss_sum, count = 0.0, 0
        for batch in eval_batches(self.eval_tokens, self.cfg.data.seq_len, self.cfg.train.micro_batch_size,
                                  self.dp_rank, self.dp_size, max_total_batches=self.cfg.train.eval_batches or None):
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
        return sum_across_ranks(values, self.ctx.device, group=self.dp_group)

    def _record_eval(self) -> dict[str, float]:
        result = self.evaluate()
        self.metrics.write(kind="eval", step=self.step, **result)
        self.progress.line(f"eval  step {self.step:>6} | loss {result['loss']:.4f} | perplexity {result['perplexity']:.2f}")
        if self.step > 0 and result["loss"] < self.best_eval:
            self.best_eval = result["loss"]
            if self.cfg.train.save_model:
                save0(self.engine.full_state_dict(), self.run_dir / "best.pt")
        return result

    def fit(self) -> dict:
        """Train for `train.steps` steps with periodic evaluation; returns the run summary."""
        t = self.cfg.train
        tokens_per_step = t.global_batch_size * self.cfg.data.seq_len
        if self.ctx.is_root:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.toml").write_text(to_toml(self.cfg))
        self.progress.line(self._banner())
        initial = self._record_eval() if t.eval_at_start and self.step == 0 else None
        start, first_step = time.perf_counter(), self.step
        while self.step < t.steps:
            t0 = time.perf_counter()
            local = self.train_step(self._micro_batches())
            self.step += 1
            self.tokens_seen += tokens_per_step
            if self.step % t.log_every == 0 or self.step == t.steps:
                loss = self._sum_over_dp([local.item()])[0] / self.dp_size
                rate = tokens_per_step / (time.perf_counter() - t0)
                lr = self.scheduler.get_last_lr()[0]
                norm = {} if self.grad_norm is None else {"grad_norm": self.grad_norm.item()}
                self.metrics.write(kind="train", step=self.step, loss=loss, lr=lr, tokens_per_s=rate, **norm)
                self.progress.step(self.step, loss, lr, rate)
            if t.eval_every and self.step % t.eval_every == 0 and self.step < t.steps:
                self._record_eval()
            self.checkpoints.poll(self.ctx.device)  # commits a finished background save; raises its error
            saved = self.checkpoints.due(self.step, t.steps)
            if saved:
                self.checkpoints.save(self.step, self.state, blocking=False)
            if self.preemption.agreed(self.ctx.device):
                return self._preempted(saved)
        self.checkpoints.wait()
        elapsed = time.perf_counter() - start
        last = self._record_eval()
        self.progress.close()
        self.preemption.restore()
        return self._finish(initial, last, elapsed, (self.step - first_step) * tokens_per_step)

    def _preempted(self, saved: bool) -> dict:
        """Every rank got here at the same step: checkpoint, then rank 0 requeues the SLURM job."""
        self.progress.close()
        self.progress.line(f"signal {self.preemption.received or '(on another rank)'}: checkpointing at step {self.step}")
        self.checkpoints.wait()
        path = self.checkpoints.root / f"step-{self.step}"
        if not saved:
            path = self.checkpoints.save(self.step, self.state)
        self.progress.line(f"checkpoint {path} committed")
        requeued, message = False, "not a SLURM job step: restart with --checkpoint.resume=auto"
        if is_root() and self.ctx.env.kind == "slurm" and self.ctx.env.job_id:
            # SLURM ends this job step as soon as the requeue is accepted: say so before asking
            self.progress.line(f"requeueing SLURM job {self.ctx.env.job_id}; it resumes from this checkpoint")
            requeued, message = requeue_job(self.ctx.env.job_id)
        requeued, message = all_gather_objects((requeued, message))[0]
        self.progress.line(message if requeued else f"{message} (exit code {EXIT_REQUEUE})")
        self.preemption.restore()
        return {"preempted": True, "step": self.step, "checkpoint": str(path), "requeued": requeued,
                "exit_code": 0 if requeued else EXIT_REQUEUE}

    def _finish(self, initial, final, elapsed: float, tokens_trained: int) -> dict:
        if self.cfg.train.save_model:
            save0(self.engine.full_state_dict(), self.run_dir / "final.pt")
        digest = weights_digest(self.engine.model_parts)
        # ranks that must hold identical weights: same place in every dimension but dp_replicate
        replicas = all_gather_objects((self.dims.coordinate("pp"), self.dims.coordinate("dp_shard"),
                                       self.dims.coordinate("tp"), digest))
        env = self.ctx.env
        write_json(self.run_dir / "ranks" / f"rank-{self.ctx.rank}.json", {
            **env.to_dict(), "device": str(self.ctx.device), "backend": self.ctx.backend,
            # the GPU this rank's visibility variables select (what SLURM bound), also on CPU-only torch builds
            "gpu": describe_devices(env.local_rank, env.local_world_size),
            "weights_sha256": digest,
        })
        summary = {
            "steps": self.step, "world_size": self.ctx.world_size, "model_size": self.cfg.model.size,
            "layout": self.dims.describe(), "parameters": self.engine.num_params, "initial_eval": initial, "final_eval": final,
            "best_eval_loss": self.best_eval, "train_seconds": elapsed,
            "tokens_per_s": tokens_trained / max(elapsed, 1e-9), "tokens_seen": self.tokens_seen,
            "weights_in_sync": replicas_agree(replicas),
        }
        if self.ctx.is_root:
            write_json(self.run_dir / "summary.json", summary)
            self.progress.line(_summary_line(summary))
        return summary

    def _layout_name(self) -> str:
        e = self.cfg.engine
        if e.name == "deepspeed":
            return f"DeepSpeed ZeRO-{e.zero_stage} over {self.dp_size} rank(s)"
        if e.name == "horovod":
            return f"Horovod over {self.dp_size} rank(s)"
        return self.dims.describe()

    def _banner(self) -> str:
        c, t = self.cfg, self.cfg.train
        return (f"exatrain: model {c.model.size} ({self.engine.num_params / 1e6:.2f}M params), data {c.data.kind} "
                f"(vocab {len(self.corpus.vocab)}, {len(self.train_tokens):,} train tokens), "
                f"{self.ctx.world_size} rank(s) on {self.ctx.device.type} ({self.ctx.backend or 'no process group'}), "
                f"layout {self._layout_name()}, global batch {t.global_batch_size} = {t.micro_batch_size} x "
                f"{self.accum} accum x {self.dp_size} data-parallel ranks, {t.steps} steps -> {self.run_dir}")


def _summary_line(s: dict) -> str:
    start = f"{s['initial_eval']['perplexity']:.2f} -> " if s["initial_eval"] else ""
    return (f"done: {s['steps']} steps in {s['train_seconds']:.1f} s ({s['tokens_per_s']:,.0f} tok/s); "
            f"validation perplexity {start}{s['final_eval']['perplexity']:.2f}; "
            f"weights in sync on {s['world_size']} rank(s): {'yes' if s['weights_in_sync'] else 'NO'}")


def _preemption_signals(setting: str, kind: str) -> tuple[str, ...]:
    names = [n.strip().upper().removeprefix("SIG") for n in setting.split(",") if n.strip()]
    if kind == "torchelastic":
        # torchrun's agent stops the surviving workers with SIGTERM when one fails: catching it here would
        # keep them alive, blocked in a collective with the dead rank, until the agent's kill timeout.
        names = [n for n in names if n != "TERM"]
    return tuple(names)


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
            local = local_tensor(p)
            h.update(f"{i}.{name}".encode())
            h.update(np.ascontiguousarray(local.detach().float().cpu().numpy()).tobytes())
    return h.hexdigest()


def replicas_agree(entries: list[tuple]) -> bool:
    """Given every rank's (place..., digest), True when ranks at the same place hold the same digest."""
    seen: dict[tuple, str] = {}
    return all(seen.setdefault(tuple(e[:-1]), e[-1]) == e[-1] for e in entries)


def _layout(cfg: Config, ctx: DistContext) -> ParallelDims:
    """The layout from the configuration, with its device mesh (for callers that did not run preflight)."""
    dims = ParallelDims.from_config(cfg.parallel, ctx.world_size)
    dims.build_mesh(ctx.device.type)
    return dims
