"""NCCL's own report of its set-up, captured to a file per rank: which network (NET/IB, NET/OFI through a
plugin such as aws-ofi-nccl / aws-ofi-rccl, or NET/Socket, i.e. TCP) its communicators use.

NCCL (and RCCL, which reads the same variables) reads NCCL_DEBUG, NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE
once, the first time it logs anything, i.e. when the process's first communicator is created. So
`enable_nccl_debug_log` must run before the process group's first NCCL collective (`exatrain doctor` calls it
before joining the group). This module writes the variables because only distributed/ writes os.environ.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

# INIT: the "Using network ..." line and the plugin lines; NET: the transport's own lines (NET/IB : Using ...)
NCCL_DEBUG_SUBSYS = "INIT,NET"


def nccl_debug_log_path(log_dir: str | Path, rank: int) -> Path:
    """The file NCCL writes rank `rank`'s log to under `log_dir` (one file per rank: ranks never share
    one)."""
    return Path(log_dir) / f"nccl-rank{rank}.log"


def nccl_debug_env(log_dir: str | Path, rank: int) -> dict[str, str]:
    """The variables that make NCCL log its set-up at INFO level into this rank's file under `log_dir`."""
    return {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": NCCL_DEBUG_SUBSYS,
        "NCCL_DEBUG_FILE": str(nccl_debug_log_path(log_dir, rank)),
    }


def enable_nccl_debug_log(log_dir: str | Path, rank: int) -> Path:
    """Make this process's NCCL log its set-up to a file of its own (before its first communicator exists);
    returns the file's path. A file name with a `%` would be expanded by NCCL (%h host, %p pid), so none is
    used."""
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    os.environ.update(nccl_debug_env(log_dir, rank))
    return nccl_debug_log_path(log_dir, rank)


def init_nccl_alone(device: torch.device) -> None:
    """Create and use an NCCL communicator of this one process on `device`, then free it: a job of one rank
    has no process group, yet NCCL's set-up (its network and plugin) is what the doctor reports."""
    if dist.is_initialized():
        raise RuntimeError("init_nccl_alone is for a process without a process group")
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=device)
    try:
        t = torch.ones(1, device=device)
        dist.all_reduce(t)
        torch.cuda.synchronize(device)
    finally:
        dist.destroy_process_group()
