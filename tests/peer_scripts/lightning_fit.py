"""A Lightning Trainer fit (DDP on CPU), in the shape of Lightning's own examples: a LightningModule, a
DataLoader, Trainer(devices=..., num_nodes=...).fit(). Writes rank-N.json after the fit."""

import argparse
import json
import os
import socket
from pathlib import Path

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--devices", type=int, required=True)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    model = Regression()
    trainer = L.Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=a.devices,
        num_nodes=a.nodes,
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(data, batch_size=8))
    strategy = trainer.strategy
    total = strategy.reduce(torch.tensor(float(trainer.global_rank + 1)), reduce_op="sum")
    report = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "local_rank": trainer.local_rank,
        "node_rank": trainer.node_rank,
        "environment": type(strategy.cluster_environment).__name__,
        "sum_of_rank_plus_one": total.item(),
        "steps": trainer.global_step,
        "weights": [round(v, 6) for v in model.layer.weight.detach().flatten().tolist()],
        "host": socket.gethostname(),
        "RANK": os.environ.get("RANK"),
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{trainer.global_rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
