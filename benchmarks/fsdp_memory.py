"""Per-rank parameter + gradient + optimizer bytes of FSDP at world size W against DDP's bytes / W.

Both layouts are built in the same run on the same W real ranks (exatrain's local launcher, gloo on CPU) by
the exatrain trainer itself; after one AdamW step and a second forward/backward each rank sums the bytes of
its local parameter, gradient and optimizer-state shards. Ratio = FSDP bytes / (DDP bytes / W), max over
ranks; goal <= 1.10. `exatrain plan`'s prediction for the same layouts is printed beside the measurement.

    .venv/bin/python -m benchmarks.fsdp_memory [--nproc 4] [--size medium]
"""

from __future__ import annotations

import argparse
import sys

from benchmarks.ranks import run_on_ranks

SEQ, BATCH = 64, 2


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=4, help="ranks (world size W)")
    p.add_argument("--size", default="medium", help="model size")
    p.add_argument("--run-dir", help="(set by the launching process) where the shared data cache lives")
    return p.parse_args(argv)


def layouts(a):
    """name -> config of the two layouts compared."""
    from exatrain.config import load_config

    base = [
        f"--model.size={a.size}",
        f"--data.seq_len={SEQ}",
        f"--train.micro_batch_size={BATCH}",
        f"--train.global_batch_size={BATCH * a.nproc}",
        "--train.device=cpu",
    ]
    return {
        name: load_config(None, base + [f"--run.dir={a.run_dir}/{name}", *extra])
        for name, extra in (
            ("ddp", ["--parallel.dp_replicate=-1", "--parallel.dp_shard=1"]),
            ("fsdp", ["--parallel.dp_replicate=1", "--parallel.dp_shard=-1"]),
        )
    }


def measure(cfg, ctx):
    """The layout as the trainer builds it; one optimizer step (AdamW state exists) and a second
    forward/backward (gradients exist): this rank's parameter + gradient + optimizer-state bytes."""
    from exatrain.tools.plan.layout import local_state_bytes
    from exatrain.train.entry import prepare_data
    from exatrain.train.trainer import Trainer

    trainer = Trainer(cfg, ctx, prepare_data(cfg))
    trainer.train_step(trainer._micro_batches())
    trainer.engine.train_step(trainer._micro_batches())
    return local_state_bytes(trainer.model, trainer.optimizer)


def worker(a, env):
    import torch

    from exatrain.distributed import all_gather_objects, init_distributed, teardown

    torch.set_num_threads(1)
    ctx = init_distributed(env, "cpu", timeout_s=300)
    cfgs = layouts(a)
    per_rank = {name: all_gather_objects(sum(measure(cfg, ctx).values())) for name, cfg in cfgs.items()}
    teardown()
    if ctx.is_root:
        report(a, cfgs, per_rank)


def report(a, cfgs, per_rank):
    import torch

    from exatrain.tools.plan import make_plan

    world = a.nproc
    fsdp, ddp = max(per_rank["fsdp"]), max(per_rank["ddp"])
    ratio = fsdp / (ddp / world)
    planned = {
        k: (lambda r: r.params + r.grads + r.optimizer)(make_plan(c, world).ranks[0]) for k, c in cfgs.items()
    }
    print(
        f"model {a.size}, synthetic data (vocab 512), AdamW, fp32, W={world} gloo ranks, torch "
        f"{torch.__version__}"
    )
    for k in ("ddp", "fsdp"):
        print(
            f"  {k:4s} per-rank params+grads+optimizer: max {max(per_rank[k]) / 2**20:8.2f} MiB "
            f"(ranks: {', '.join(f'{b / 2**20:.2f}' for b in per_rank[k])}); "
            f"exatrain plan: {planned[k] / 2**20:.2f} MiB"
        )
    print(f"ratio FSDP / (DDP / {world}) = {ratio:.3f}  (goal <= 1.10)")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    return run_on_ranks("benchmarks.fsdp_memory", argv, parse(argv), lambda a: layouts(a)["ddp"], worker)


if __name__ == "__main__":
    sys.exit(main())
