"""Whether this process is rank 0, without setting anything up (0 when no process group runs)."""

from __future__ import annotations


def is_rank0() -> bool:
    """True on global rank 0 of the running process group, or when there is none."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
