"""Step time of a loop written with exatrain's public API against the same loop in plain PyTorch, DDP on 2 \
ranks.

Both sides train the reference LM (same size, seed, data, global batch and AdamW settings) with DDP over
the same gloo ranks (one thread each), started by exatrain's local launcher:
- plain: `DistributedDataParallel(model)`, a torch DataLoader with a `DistributedSampler`, the usual step;
- exatrain: `exatrain.parallelize(model, ctx)`, `exatrain.DataLoader`, and `ckpt.step(n)` of an
  `exatrain.Checkpointer` (interval 0: no saves, but its per-step signal check, a tiny all-reduce, runs).
The process group comes from `exatrain.init()` for both (set-up is not timed; a process has one default
group). Repetitions of `--steps` steps are interleaved (A B, B A, ...) so machine noise hits both alike;
each starts after a barrier and counts with its slowest rank. Result: ratio of median repetition times
(exatrain / plain). Goal: <= 1.02.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.api_overhead [--nproc 2] [--size small] [--steps 10]
        [--reps 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from benchmarks.ranks import run_on_ranks


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--size", default="small")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=16, help="global batch (samples per step over all ranks)")
    p.add_argument("--steps", type=int, default=10, help="steps per timed repetition")
    p.add_argument("--reps", type=int, default=7, help="timed repetitions per side")
    return p.parse_args(argv)


class Windows:
    """A map-style dataset of fixed random token windows: (input, target) pairs."""

    def __init__(self, n, seq_len, vocab, seed=0):
        import torch

        g = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab, (n, seq_len + 1), generator=g)

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return self.tokens[i, :-1], self.tokens[i, 1:]


def endless(loader, sampler=None):
    """Batches across epochs (DistributedSampler needs set_epoch; exatrain.DataLoader moves on by itself)."""
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def plain_side(a, ds, ctx, model):
    """A hand-written DDP loop as in PyTorch's tutorial: returns a function running one optimizer step."""
    import torch
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    sampler = DistributedSampler(
        ds, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=0, drop_last=True
    )
    batches = endless(
        DataLoader(ds, batch_size=a.batch // ctx.world_size, sampler=sampler, drop_last=True), sampler
    )
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)

    def step(n):
        x, y = next(batches)
        loss = ddp(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def exatrain_side(a, ds, ctx, model, run_dir):
    """The same loop through exatrain.parallelize, exatrain.DataLoader and a Checkpointer's step()."""
    import torch

    import exatrain

    model = exatrain.parallelize(model, ctx, layout="ddp")
    loader = exatrain.DataLoader(ds, ctx, batch_size=a.batch, seed=0)
    batches = endless(loader)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt = exatrain.Checkpointer(run_dir, ctx, model=model, optimizer=opt, loader=loader, interval=0)

    def step(n):
        x, y = next(batches)
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        ckpt.step(n)

    return step, ckpt


def worker(a, env):
    import torch
    import torch.distributed as dist

    import exatrain
    from exatrain.distributed import all_gather_objects
    from exatrain.models.transformer import build_model

    torch.set_num_threads(1)  # 2 ranks on 2 cores: more threads oversubscribe (torch-cpu-facts.md)
    vocab = 512
    with exatrain.init(device="cpu", seed=0, quiet=True) as ctx, tempfile.TemporaryDirectory() as tmp:
        ds = Windows(64 * a.batch, a.seq_len, vocab)
        torch.manual_seed(0)
        plain = plain_side(a, ds, ctx, build_model(a.size, vocab, a.seq_len))
        torch.manual_seed(0)  # the same initial weights on both sides
        exa, ckpt = exatrain_side(a, ds, ctx, build_model(a.size, vocab, a.seq_len), tmp)
        sides, counters = {"exatrain": exa, "plain": plain}, {"exatrain": 0, "plain": 0}
        times = {k: [] for k in sides}

        def rep(name):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                counters[name] += 1
                sides[name](counters[name])
            return time.perf_counter() - t0

        for name in sides:  # warm-up (DDP builds its buckets on the first steps)
            rep(name)
        for i in range(a.reps):
            for name in list(sides) if i % 2 == 0 else list(reversed(sides)):
                times[name].append(rep(name))
        ckpt.close()
        everyone = all_gather_objects(times)
        n_params = sum(p.numel() for p in build_model(a.size, vocab, a.seq_len).parameters())
        if ctx.is_root:
            report(a, everyone, n_params)


def report(a, everyone, n_params):
    import torch

    reps = {k: [max(r[k][i] for r in everyone) / a.steps for i in range(a.reps)] for k in everyone[0]}
    med = {k: statistics.median(v) for k, v in reps.items()}
    print(
        f"model {a.size} ({n_params / 1e6:.1f}M params), DDP on {a.nproc} gloo ranks x 1 thread, "
        "global batch "
        f"{a.batch} x {a.seq_len} tokens, {a.reps} x {a.steps} steps per side, torch {torch.__version__}"
    )
    for k, v in reps.items():
        print(
            f"  {k:9s} median step {med[k] * 1000:8.2f} ms  (all: {', '.join(f'{t * 1000:.1f}' for t in v)})"
        )
    print(f"ratio exatrain/plain = {med['exatrain'] / med['plain']:.3f}  (goal <= 1.02)")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    return run_on_ranks("benchmarks.api_overhead", argv, parse(argv), None, worker)


if __name__ == "__main__":
    sys.exit(main())
