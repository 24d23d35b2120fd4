"""A script that starts its own processes, as PyTorch's DDP tutorial does: `mp.spawn(worker, nprocs=2)`, each
worker joining a gloo group at a MASTER_ADDR/MASTER_PORT the script sets itself (here: the port given as the
first argument). Each worker writes rank-N.json with its all-reduce result into the folder of argument 2."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world_size, port, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = port
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    report = {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "sum_of_rank_plus_one": total.item(),
    }
    Path(out, f"rank-{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    Path(sys.argv[2]).mkdir(parents=True, exist_ok=True)
    mp.spawn(worker, args=(2, sys.argv[1], sys.argv[2]), nprocs=2)
