"""Under `exatrain run` in an MPI job: the torch variables exatrain set, the launcher's own variables it read
them from, the group they form, an all-reduce. Writes rank-N.json into the folder given as argument 1."""

import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist

NAMES = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
)
#: Open MPI's and the PMI launchers' (MPICH's Hydra, Intel MPI) rank variables (exatrain/env/mpi.py)
LAUNCHER_NAMES = (
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
)

dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
report = {
    "seen": {n: os.environ.get(n) for n in NAMES},
    "launcher": {n: os.environ[n] for n in LAUNCHER_NAMES if n in os.environ},
    "rank": dist.get_rank(),
    "world_size": dist.get_world_size(),
    "sum_of_rank_plus_one": total.item(),
    "host": socket.gethostname(),
}
dist.destroy_process_group()
Path(sys.argv[1], f"rank-{report['rank']}.json").write_text(json.dumps(report))
