"""Per-rank parameter + gradient + optimizer bytes of FSDP at world size W against DDP's bytes / W.

Both layouts are built in the same run on the same W real ranks (exatrain's local launcher, gloo on CPU):
the reference model, one AdamW step on a random batch, then each rank sums the bytes of its local
parameter, gradient and optimizer-state shards. Ratio = FSDP bytes / (DDP bytes / W), max over ranks;
goal <= 1.10. `exatrain plan`'s prediction for the same layouts is printed beside the measurement.

    .venv/bin/python -m benchmarks.fsdp_memory [--nproc 4] [--size medium]
"""

from __future__ import annotations

import argparse
import json
import sys

from exatrain.env import detect_environment
from exatrain.launch import launch_local

VOCAB, SEQ, BATCH = 512, 64, 2


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=4, help="ranks (world size W)")
    p.add_argument("--size", default="medium", help="model size")
    return p.parse_args(argv)


def layouts(size: str):
    """name -> config overrides of the two layouts compared."""
    from exatrain.config import load_config

    base = [f"--model.size={size}", f"--data.seq_len={SEQ}", f"--train.micro_batch_size={BATCH}",
            "--train.global_batch_size=64"]
    return {"ddp": load_config(None, base + ["--parallel.dp_replicate=-1", "--parallel.dp_shard=1"]),
            "fsdp": load_config(None, base + ["--parallel.dp_replicate=1", "--parallel.dp_shard=-1"])}


def measure(cfg, env):
    """Build the layout of `cfg` on this rank, take one AdamW step, return its local state bytes."""
    import torch

    from exatrain.dist.parallel_dims import ParallelDims
    from exatrain.models.transformer import build_model
    from exatrain.train.optim import build_optimizer
    from exatrain.train.plan.layout import apply_layout, local_state_bytes

    dims = ParallelDims.from_config(cfg.parallel, env.world_size)
    dims.build_mesh("cpu")
    torch.manual_seed(0)
    model = build_model(cfg.model.size, VOCAB, SEQ)
    wrapped = torch.nn.parallel.DistributedDataParallel(model) if dims.ddp else model
    if not dims.ddp:
        apply_layout(model, dims, cfg)
    opt = build_optimizer(model, cfg.train)
    x = torch.randint(VOCAB, (BATCH, SEQ))
    wrapped(x, x).backward()
    opt.step()
    return local_state_bytes(model, opt)


def worker(a, env):
    import torch

    from exatrain.dist import all_gather_objects, init_distributed, teardown

    torch.set_num_threads(1)
    init_distributed(env, "cpu", timeout_s=300)
    cfgs = layouts(a.size)
    per_rank = {name: all_gather_objects(sum(measure(cfg, env).values())) for name, cfg in cfgs.items()}
    teardown()
    if env.global_rank == 0:
        report(a, env.world_size, cfgs, per_rank)


def report(a, world, cfgs, per_rank):
    import torch

    from exatrain.train.plan import make_plan

    fsdp, ddp = max(per_rank["fsdp"]), max(per_rank["ddp"])
    ratio = fsdp / (ddp / world)
    planned = {k: (lambda r: r.params + r.grads + r.optimizer)(make_plan(c, world, vocab_size=VOCAB).ranks[0])
               for k, c in cfgs.items()}
    print(f"model {a.size} (vocab {VOCAB}), AdamW, fp32, W={world} gloo ranks, torch {torch.__version__}")
    for k in ("ddp", "fsdp"):
        print(f"  {k:4s} per-rank params+grads+optimizer: max {max(per_rank[k]) / 2**20:8.2f} MiB "
              f"(ranks: {', '.join(f'{b / 2**20:.2f}' for b in per_rank[k])}); exatrain plan: {planned[k] / 2**20:.2f} MiB")
    print(json.dumps({"world": world, "fsdp_bytes": fsdp, "ddp_bytes": ddp, "ratio": ratio}))
    print(f"ratio FSDP / (DDP / {world}) = {ratio:.3f}  (goal <= 1.10)")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    env = detect_environment()
    if env.kind == "local":  # not started by a launcher: start W workers through exatrain's local launcher
        return launch_local(a.nproc, "benchmarks.fsdp_memory", argv)
    worker(a, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
