"""Shared set-up of the checkpoint benchmarks: relaunch under torchrun, build a real trainer, time steps.

Not a benchmark itself (the leading underscore keeps it out of `ls benchmarks/*.py` listings of scripts).
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.ranks import run_on_ranks
from exatrain.config import load_config
from exatrain.distributed import all_gather_objects, barrier, init_distributed, is_root, teardown
from exatrain.tools.plan.layout import local_state_bytes
from exatrain.train.entry import prepare_data
from exatrain.train.trainer import Trainer


def arguments(description: str) -> argparse.ArgumentParser:
    """The options both checkpoint benchmarks take; each adds its own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--dir", default=None, help="where to write (default: the temp dir); the disk under test")
    p.add_argument("--size", default="medium")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--nproc", type=int, default=2)
    return p


def relaunch_or_run(module: str, a, worker) -> int:
    """Outside a launcher: start `a.nproc` workers of `python -m module` through torchrun and return its exit
    code. Inside one (a worker): join the group, run `worker(ctx)`, leave."""

    def joined(_a, env) -> None:
        ctx = init_distributed(env, "cpu")
        try:
            worker(ctx)
        finally:
            teardown()

    return run_on_ranks(module, sys.argv[1:], a, None, joined)


@contextlib.contextmanager
def shared_scratch(parent: str | None):
    """A folder made by rank 0 under `parent` (default: the temp dir), the same path on every rank; removed
    at the end."""
    made = tempfile.mkdtemp(dir=parent, prefix="exatrain-ckpt-bench-") if is_root() else None
    path = Path(all_gather_objects(made)[0])
    try:
        yield path
    finally:
        barrier()
        if is_root():
            shutil.rmtree(path, ignore_errors=True)


def build_trainer(ctx, run_dir: Path, size: str, seq_len: int, micro_batch: int, async_save: bool) -> Trainer:
    """The exatrain trainer (DDP over the group) of a `size` model with its AdamW state populated by one step.

    Checkpoints are saved by the benchmark itself (interval 0 keeps the trainer from saving on its own).
    """
    cfg = load_config(
        None,
        [
            f"--model.size={size}",
            f"--data.seq_len={seq_len}",
            f"--run.dir={run_dir}",
            "--train.device=cpu",
            f"--train.global_batch_size={micro_batch * ctx.world_size}",
            f"--train.micro_batch_size={micro_batch}",
            f"--train.steps={10**6}",
            "--checkpoint.interval=0",
            "--checkpoint.keep=2",
            f"--checkpoint.async_save={'true' if async_save else 'false'}",
        ],
    )
    trainer = Trainer(cfg, ctx, prepare_data(cfg))
    step(trainer)  # creates the optimizer's moments, so the checkpoint holds the full training state
    return trainer


def step(trainer: Trainer) -> float:
    """One optimizer step of the trainer, as its loop does it (including the per-step poll of a background
    save); returns its wall time in seconds."""
    barrier()
    t0 = time.perf_counter()
    trainer.train_step(trainer._micro_batches())
    trainer.step += 1
    trainer.checkpoints.poll(trainer.ctx.device)
    return time.perf_counter() - t0


def describe(trainer: Trainer, ctx, a) -> str:
    """The first line of a checkpoint benchmark's report: model, ranks, state per rank, torch, directory
    (a collective: every rank calls it, rank 0 prints it)."""
    local = local_state_bytes(trainer.model, trainer.optimizer)
    per_rank = all_gather_objects(local["params"] + local["optimizer"])
    return (
        f"model {a.size} ({trainer.engine.num_params / 1e6:.1f}M params) + AdamW, "
        f"{ctx.world_size} ranks (DDP), "
        f"state per rank {per_rank[0] / 2**20:.0f} MiB, torch {torch.__version__}, dir "
        f"{a.dir or tempfile.gettempdir()}"
    )


def median_ms(values: list[float]) -> str:
    """'median ms (all: a, b, c)' for a list of seconds."""
    return (
        f"{statistics.median(values) * 1000:9.1f} ms  (all: {', '.join(f'{v * 1000:.0f}' for v in values)})"
    )
