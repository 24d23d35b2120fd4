"""Small rank-aware helpers: who is root, print/save once, and means across ranks."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist


def rank() -> int:
    """This process's global rank (0 when no process group is running)."""
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    """Number of ranks (1 when no process group is running)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def is_root() -> bool:
    """True on global rank 0, the rank that prints and writes shared files."""
    return rank() == 0


def print0(*args, **kwargs) -> None:
    """print() on rank 0 only, flushed so lines interleave sanely in job logs."""
    if is_root():
        print(*args, **kwargs, flush=True)


def save0(obj, path: str | Path) -> None:
    """torch.save on rank 0 only, atomically (temp file then rename): no half-written files."""
    if not is_root():
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def mean_across_ranks(values, device: torch.device | None = None):
    """Average a scalar, a list of scalars or a dict of named scalars over all ranks (collective).

    Returns the same shape as given (float, list of floats, dict). Sums in float64 and divides (gloo has
    no ReduceOp.AVG for every dtype). `device`: where the reduction runs; default the current GPU under
    nccl, else the CPU. Without a process group the values come back unchanged (as floats).
    """
    if isinstance(values, dict):
        keys = sorted(values)
        return dict(zip(keys, mean_across_ranks([values[k] for k in keys], device)))
    if not isinstance(values, (list, tuple)):
        return mean_across_ranks([values], device)[0]
    floats = [float(v) for v in values]
    if not dist.is_initialized() or world_size() == 1:
        return floats
    t = torch.tensor(floats, dtype=torch.float64, device=device or default_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    t /= world_size()
    return t.tolist()


def default_device() -> torch.device:
    """Where collectives on new tensors run: the current GPU under nccl, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def sum_across_ranks(values: list[float], device: torch.device | None = None, group=None) -> list[float]:
    """Sum a list of scalars over all ranks, or over the ranks of process `group` (float64)."""
    if not dist.is_initialized():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t.tolist()


def any_rank(flag: bool, device: torch.device | None = None) -> bool:
    """True on every rank if `flag` is true on at least one (collective; the local flag without a group)."""
    return _reduce_flag(flag, device, dist.ReduceOp.MAX)


def all_ranks(flag: bool, device: torch.device | None = None) -> bool:
    """True on every rank if `flag` is true on all of them (collective; the local flag without a group)."""
    return _reduce_flag(flag, device, dist.ReduceOp.MIN)


def _reduce_flag(flag: bool, device, op) -> bool:
    if not dist.is_initialized():
        return bool(flag)
    t = torch.tensor([int(flag)], device=device)
    dist.all_reduce(t, op=op)
    return bool(t.item())


class LaggedAnyRank:
    """`any_rank` for a flag checked after every training step, without making the host wait for the GPU.

    On a CUDA device `any_rank` would copy the flag to the GPU and read the reduced value back, and both
    copies wait until the GPU has finished the whole step: the host cannot queue the next step ahead, so the
    GPU idles while Python starts it. Here each call starts its all-reduce in the stream's order (pinned
    buffers, non-blocking copies) and returns the PREVIOUS call's result, waiting only for that one (an event
    recorded a step ago, normally long done). Every rank reads the same reduced value, so all ranks still
    agree, one call later. Without a group, or off CUDA (gloo on CPUs, where a reduction is cheap), it is
    `any_rank`.
    """

    def __init__(self):
        self._pending = None  # (pinned host result, CUDA event after its copy) of the last call

    def __call__(self, flag: bool, device: torch.device | None = None) -> bool:
        if not dist.is_initialized() or device is None or device.type != "cuda":
            return any_rank(flag, device)
        t = torch.tensor([int(flag)], dtype=torch.int32).pin_memory().to(device, non_blocking=True)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        result = torch.empty(1, dtype=torch.int32, pin_memory=True)
        result.copy_(t, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        previous, self._pending = self._pending, (result, done)
        if previous is None:
            return False
        previous[1].synchronize()
        return bool(previous[0].item())


def all_gather_objects(obj) -> list:
    """Every rank's `obj`, in rank order (a list of one without a process group)."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    """Wait for all ranks (no-op without a process group)."""
    if dist.is_initialized():
        dist.barrier()
