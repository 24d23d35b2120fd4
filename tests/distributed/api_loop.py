"""A hand-written training loop on exatrain's public API, as a user writes it (run by test_api.py).

    python api_loop.py RUN_DIR --steps 12 --layout ddp --interval 3 [--dp-shard 2] [--sleep 0.2]

A tiny regression model with repeated blocks (an nn.ModuleList, FSDP shards each), a map-style dataset,
SGD with momentum and a LR schedule (both checkpointed), the loader's position and a user value in
`extra`; each step's loss (mean over ranks) goes to RUN_DIR/metrics.jsonl.
"""

import argparse
import time

import torch
from torch import nn

import exatrain


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm, self.lin = nn.LayerNorm(dim), nn.Linear(dim, dim)

    def forward(self, x):
        return x + torch.tanh(self.lin(self.norm(x)))


class Net(nn.Module):
    def __init__(self, dim=16, depth=3):
        super().__init__()
        self.inp = nn.Linear(8, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(depth))
        self.out = nn.Linear(dim, 1)

    def forward(self, x):
        x = self.inp(x)
        for block in self.layers:
            x = block(x)
        return self.out(x)


class Points(torch.utils.data.Dataset):
    """200 fixed random points and a nonlinear target."""

    def __init__(self):
        g = torch.Generator().manual_seed(123)
        self.x = torch.randn(200, 8, generator=g)
        self.y = torch.sin(self.x[:, :4].sum(1, keepdim=True)) + 0.1 * self.x[:, 4:5]

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--layout", default="auto")
    p.add_argument("--interval", type=int, default=3)
    p.add_argument("--dp-shard", type=int, default=1)
    p.add_argument("--sleep", type=float, default=0.0)
    a = p.parse_args()

    with exatrain.init(seed=7, dp_shard=a.dp_shard, quiet=True) as ctx:
        model = exatrain.parallelize(Net(), ctx, layout=a.layout)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
        loader = exatrain.DataLoader(Points(), ctx, batch_size=32, seed=1)
        extra = {"seen": 0}
        ckpt = exatrain.Checkpointer(
            a.run_dir,
            ctx,
            model=model,
            optimizer=opt,
            scheduler=sched,
            loader=loader,
            extra=extra,
            interval=a.interval,
            keep=0,
            last_step=a.steps,
        )
        step = ckpt.resume()
        log = exatrain.MetricsLog(f"{a.run_dir}/metrics.jsonl", resume_step=step)
        while step < a.steps:
            for x, y in loader:
                loss = nn.functional.mse_loss(model(x.to(ctx.device)), y.to(ctx.device))
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
                step += 1
                extra["seen"] += 32
                log.write(
                    step=step,
                    loss=exatrain.mean_across_ranks(loss.item()),
                    epoch=loader.epoch,
                    seen=extra["seen"],
                )
                ckpt.step(step)
                time.sleep(a.sleep)
                if step == a.steps:
                    break
        ckpt.close()
        exatrain.save0(exatrain.full_state_dict(model), f"{a.run_dir}/final.pt")


if __name__ == "__main__":
    main()
