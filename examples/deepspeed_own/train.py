"""Your own DeepSpeed script on exatrain's launch path (no `deepspeed` launcher, no pdsh, no ssh).

    exatrain run --nproc 2 examples/deepspeed_own/train.py --zero 2        # 2 local ranks
    srun exatrain run examples/deepspeed_own/train.py --zero 3             # inside a SLURM job step
    python -m torch.distributed.run --standalone --nproc-per-node 2 examples/deepspeed_own/train.py

exatrain.init_deepspeed() detects the environment, joins the process group and hands it to
`deepspeed.init_distributed`; the rest is plain DeepSpeed: `deepspeed.initialize` with a DeepSpeed JSON
config (ds_config.json next to this file; --zero overrides its ZeRO stage), `engine.backward`,
`engine.step`. The model is a small MLP regression on synthetic data, each rank drawing its share of every
global batch. Rank 0 writes --out (JSON): the loss of every step and the settings it ran with.
"""

import argparse
import json
from pathlib import Path

import torch
from torch import nn

import exatrain


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--config", default=str(Path(__file__).with_name("ds_config.json")), help="DeepSpeed JSON config"
    )
    p.add_argument("--zero", type=int, default=None, help="ZeRO stage 0-3 (overrides the config's)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--out", default="deepspeed-own.json", help="rank 0 writes the losses here")
    return p.parse_args()


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))


def global_batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same global batch on every rank for a step (a fixed target function plus noise)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size, 16, generator=g)
    y = torch.sin(x[:, :4].sum(dim=1, keepdim=True)) + 0.01 * torch.randn(size, 1, generator=g)
    return x, y


def main():
    args = parse_args()
    ctx = exatrain.init_deepspeed(seed=0)  # environment -> process group -> deepspeed.init_distributed
    import deepspeed  # after init_deepspeed: it chose DeepSpeed's accelerator

    config = json.loads(Path(args.config).read_text())
    if args.zero is not None:
        config.setdefault("zero_optimization", {})["stage"] = args.zero
    model = make_model()  # same seed on every rank: same initial weights
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)

    micro = engine.train_micro_batch_size_per_gpu()
    accum = engine.gradient_accumulation_steps()
    losses = []
    for step in range(args.steps):
        x, y = global_batch(step, micro * accum * ctx.world_size)
        mine = slice(ctx.rank * micro * accum, (ctx.rank + 1) * micro * accum)  # this rank's share
        step_loss = 0.0
        for i in range(accum):
            part = slice(mine.start + i * micro, mine.start + (i + 1) * micro)
            loss = nn.functional.mse_loss(engine(x[part].to(engine.device)), y[part].to(engine.device))
            engine.backward(loss)
            engine.step()  # DeepSpeed steps the optimizer at the accumulation boundary
            step_loss += loss.item() / accum
        losses.append(exatrain.mean_across_ranks(step_loss))
        exatrain.print0(f"step {step + 1:>3}  loss {losses[-1]:.6f}")

    if ctx.is_root:
        Path(args.out).write_text(
            json.dumps(
                {
                    "losses": losses,
                    "world_size": ctx.world_size,
                    "zero_stage": engine.zero_optimization_stage(),
                    "micro_batch": micro,
                    "accumulation": accum,
                }
            )
        )
    ctx.close()


if __name__ == "__main__":
    main()
