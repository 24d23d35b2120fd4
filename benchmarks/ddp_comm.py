"""Communication overhead of DDP: whole steps of the trainer's loop with gradient sync vs without it.

Real ranks (exatrain's local launcher, gloo on CPU, one thread each) run the exatrain trainer's `fit()` on
the reference model in blocks of `--block` steps, alternating blocks with normal steps (DDP all-reduces the
gradients, overlapped with backward) and blocks run under `no_sync()` (no gradient communication) in A B, B A
order, so machine noise hits both alike. A block is timed as whole `fit()` steps: the loop around the step
(loss all-reduce and `.item()` on log steps, metrics, checkpoint polling, the preemption check) is in both
sides; the per-fit costs (final evaluation of one batch, weights digest) are measured by a `fit()` of no step
right after and subtracted. Every block starts after a barrier and counts with the time of its slowest rank.
Overhead = median over pairs of (sync - no_sync) / sync (the ratio of median and of minimum step times is
printed too); goal <= 5 % on the `small` model. (Until 2026-11 only the step function was timed.)

    .venv/bin/python -m benchmarks.ddp_comm [--nproc 2] [--size small] [--pairs 40]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

from benchmarks.ranks import run_on_ranks


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--size", default="small")
    p.add_argument("--pairs", type=int, default=12, help="timed (sync, no_sync) block pairs")
    p.add_argument("--block", type=int, default=5, help="fit() steps per timed block")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--micro-batch", type=int, default=16, help="samples per rank per step")
    p.add_argument("--run-dir", help="(set by the launching process) where the shared data cache lives")
    return p.parse_args(argv)


def config(a):
    from exatrain.config import load_config

    return load_config(
        None,
        [
            f"--model.size={a.size}",
            f"--data.seq_len={a.seq_len}",
            f"--run.dir={a.run_dir}/run",
            f"--train.micro_batch_size={a.micro_batch}",
            f"--train.global_batch_size={a.micro_batch * a.nproc}",
            "--train.device=cpu",
            f"--train.steps={10**6}",
            "--parallel.dp_replicate=-1",
            "--parallel.dp_shard=1",
            "--train.eval_at_start=false",
            "--train.eval_every=0",
            "--train.eval_batches=1",
            "--train.save_model=false",
            "--train.log_every=10",
        ],
    )


def timed(step) -> float:
    """Seconds of one step, started together with the other ranks."""
    import torch.distributed as dist

    dist.barrier()
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def worker(a, env):
    import torch

    from exatrain.distributed import all_gather_objects, init_distributed, teardown
    from exatrain.train.entry import prepare_data
    from exatrain.train.trainer import Trainer

    torch.set_num_threads(1)  # 2 ranks on 2 cores: more threads oversubscribe (torch-cpu-facts.md)
    cfg = config(a)
    ctx = init_distributed(env, "cpu", timeout_s=300)
    trainer = Trainer(cfg, ctx, prepare_data(cfg))

    trainer.progress.enabled = False  # no progress lines (the loss is still reduced and recorded)

    def fit(steps):
        trainer.cfg = dataclasses.replace(
            trainer.cfg, train=dataclasses.replace(trainer.cfg.train, steps=trainer.step + steps)
        )
        return timed(trainer.fit)

    def synced():
        return (fit(a.block) - fit(0)) / a.block

    def unsynced():
        with trainer.engine.ddp.no_sync():  # the same steps, gradients stay local: no gradient communication
            return (fit(a.block) - fit(0)) / a.block

    sides = {"sync": synced, "no_sync": unsynced}
    for step in (synced, unsynced):
        step()  # warm-up (DDP's first step builds its buckets)
    times = {k: [] for k in sides}
    for i in range(a.pairs):
        for name in list(sides) if i % 2 == 0 else list(reversed(sides)):
            times[name].append(sides[name]())
    everyone = all_gather_objects(times)
    teardown()
    if ctx.is_root:
        report(a, everyone, trainer.engine.num_params)


def report(a, everyone, n_params):
    import torch

    # a step ends when its slowest rank is done
    steps = {k: [max(r[k][i] for r in everyone) for i in range(a.pairs)] for k in everyone[0]}
    med = {k: statistics.median(v) for k, v in steps.items()}
    low = {k: min(v) for k, v in steps.items()}
    print(
        f"model {a.size} ({n_params / 1e6:.1f}M params, {n_params * 4 / 2**20:.1f} MiB of fp32 gradients), "
        f"DDP on {a.nproc} gloo ranks x 1 thread, micro batch {a.micro_batch} x {a.seq_len} tokens, "
        f"{a.pairs} blocks of {a.block} whole fit() steps per side, torch {torch.__version__}"
    )
    for k, v in steps.items():
        print(
            f"  {k:8s} median step {med[k] * 1000:8.2f} ms, min {low[k] * 1000:8.2f} ms "
            f"(quartiles {', '.join(f'{q * 1000:.1f}' for q in statistics.quantiles(v, n=4))})"
        )
    # adjacent steps of a pair see about the same machine load: the median paired difference cancels drift
    paired = statistics.median((s - n) / s for s, n in zip(steps["sync"], steps["no_sync"]))
    print(
        f"sync overhead = {paired:.1%} of the step by the median of paired steps, "
        f"{(med['sync'] - med['no_sync']) / med['sync']:.1%} by medians, "
        f"{(low['sync'] - low['no_sync']) / low['sync']:.1%} by minima  (goal <= 5%)"
    )


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    return run_on_ranks("benchmarks.ddp_comm", argv, parse(argv), config, worker)


if __name__ == "__main__":
    sys.exit(main())
