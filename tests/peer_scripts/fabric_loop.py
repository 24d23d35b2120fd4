"""A Lightning Fabric loop (DDP on CPU), in the shape of Fabric's own documentation: Fabric(...).launch(),
setup, setup_dataloaders, fabric.backward. Writes rank-N.json at the end."""

import argparse
import json
import os
import socket
from pathlib import Path

import torch
from lightning.fabric import Fabric
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, required=True)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    fabric = Fabric(accelerator="cpu", strategy="ddp", devices=a.devices, num_nodes=a.nodes)
    fabric.launch()
    fabric.seed_everything(0)
    model = nn.Linear(8, 1)
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = fabric.setup_dataloaders(DataLoader(data, batch_size=8))
    for _step, (x, y) in zip(range(4), loader):
        optimizer.zero_grad()
        fabric.backward(nn.functional.mse_loss(model(x), y))
        optimizer.step()
    total = fabric.all_reduce(torch.tensor(float(fabric.global_rank + 1)), reduce_op="sum")
    gathered = fabric.all_gather(torch.tensor([fabric.global_rank]))
    report = {
        "rank": fabric.global_rank,
        "world_size": fabric.world_size,
        "local_rank": fabric.local_rank,
        "node_rank": fabric.node_rank,
        "environment": type(fabric.strategy.cluster_environment).__name__,
        "sum_of_rank_plus_one": total.item(),
        "gathered": gathered.flatten().tolist(),
        "weights": [round(v, 6) for v in model.weight.detach().flatten().tolist()],
        "host": socket.gethostname(),
        "RANK": os.environ.get("RANK"),
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{fabric.global_rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
