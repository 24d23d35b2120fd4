"""A plain torchrun-style DDP script, in the shape of PyTorch's DDP tutorial: nothing in it knows exatrain.

It reads its place in the job from the environment (`init_process_group()` with no arguments, LOCAL_RANK for
the GPU), wraps a tiny model in DDP, shards a synthetic dataset with DistributedSampler and trains a few
epochs. Start it with `torchrun`, `exatrain run --nproc 2 train.py`, or `exatrain submit` on a cluster;
`python train.py` without a launcher (no RANK in the environment) trains as a world of one.

Besides training, every rank writes OUT/rank-N.json with the launcher variables as it saw them, its losses
(the epochs' means over all ranks, and its own loss of every step) and a checksum of its weights (the tests
check these; DDP keeps the weights equal on every rank).
"""

import argparse
import json
import os
import socket

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

SEEN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def make_dataset(n: int = 256) -> TensorDataset:
    """y = x @ w + 0.5 + noise, the same on every rank (fixed seed)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    y = x @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.5 + 0.01 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def main() -> None:
    parser = argparse.ArgumentParser(description="tiny DDP regression")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--out", default="ddp-ranks", help="folder for the per-rank JSON reports")
    args = parser.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend=backend)  # env:// from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    else:  # `python train.py`, no launcher: a world of one
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    model = DDP(
        nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to(device),
        device_ids=[local_rank] if device.type == "cuda" else None,
    )
    data = make_dataset()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    losses, step_losses = [], []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on every rank
        total = torch.zeros(2, device=device)
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
            loss.backward()  # DDP all-reduces the gradients here
            optimizer.step()
            step_losses.append(loss.item())  # this rank's mean over its share of the step's samples
            total += torch.stack([loss.detach() * len(x), torch.tensor(float(len(x)), device=device)])
        dist.all_reduce(total)  # the epoch's mean loss over all ranks' samples
        losses.append(total[0].item() / total[1].item())
        if rank == 0:
            print(f"epoch {epoch}: loss {losses[-1]:.4f}", flush=True)

    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    report = {
        "seen": {k: os.environ.get(k) for k in SEEN},
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "rank": rank,
        "world_size": world,
        "samples": len(sampler),
        "losses": losses,
        "step_losses": step_losses,
        "checksum": checksum,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank-{rank}.json"), "w") as f:
        json.dump(report, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
