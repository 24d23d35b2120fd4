"""DeepSpeed on exatrain's launch path: the process group exatrain set up, handed to DeepSpeed.

DeepSpeed's own launcher (`deepspeed`, pdsh/ssh between nodes) is never used: exatrain detects the
environment (srun, mpirun, torchrun, `exatrain run`, a plain process), joins the process group, and
`deepspeed.init_distributed` wraps that existing group. Everything DeepSpeed does afterwards
(`deepspeed.initialize`, ZeRO's collectives, checkpoints) runs on it.

Same role as engines/horovod/setup.py: each engine package has its setup.py.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

import exatrain.engines.deepspeed.checkpoints  # noqa: F401  registers DeepSpeed's checkpoints with the Checkpointer
from exatrain.distributed.context import Context, init
from exatrain.distributed.variables import set_variables
from exatrain.errors import ExatrainError

#: DeepSpeed's CPU-only shared-memory all-reduce, used only by its tensor-parallel *inference* kernels
#: (deepspeed.comm.inference_all_reduce). Training never calls it, but DeepSpeed JIT-compiles it (~2 min
#: with g++) when it wraps a process group on the CPU accelerator.
SHM_COMM_OP = "deepspeed_shm_comm"


def import_deepspeed(device: str = "auto"):
    """Import deepspeed with the accelerator that matches this rank's device.

    DS_ACCELERATOR is read once, at DeepSpeed's first use: on a machine without a GPU (or device="cpu")
    it is set to "cpu" unless the user set it, so DeepSpeed never probes for accelerators it cannot use.
    """
    if device == "cpu" or not torch.cuda.is_available():
        set_variables({"DS_ACCELERATOR": "cpu"}, overwrite=False)
    try:
        import deepspeed
    except ImportError as exc:
        raise ExatrainError(
            f"DeepSpeed is not installed in this environment ({exc})",
            "pip install 'exatrain[deepspeed]' (or bash scripts/install.sh deepspeed)",
        ) from exc
    return deepspeed


def _init_distributed(deepspeed, backend: str, timeout_s: float = 300.0, shm_comm: bool = False) -> None:
    """`deepspeed.init_distributed` on the process group that already exists (exatrain's), never a new one."""
    if not shm_comm:
        deepspeed.ops.__compatible_ops__[SHM_COMM_OP] = False  # DeepSpeed documents this dict as editable
    deepspeed.init_distributed(
        dist_backend=backend, auto_mpi_discovery=False, timeout=datetime.timedelta(seconds=timeout_s)
    )


def attach_deepspeed(ctx: Context, timeout_s: float = 300.0, shm_comm: bool = False):
    """`exatrain.attach_deepspeed`: hand the process group of `ctx` (exatrain.init) to DeepSpeed
    (`deepspeed.init_distributed` on it, never a new group or DeepSpeed's launcher); returns the deepspeed
    module. A single process gets a process group of one first (DeepSpeed needs a group even then;
    `ctx.backend` then names it). For code that called `exatrain.init` already; `init_deepspeed` does both.
    `shm_comm`: see `init_deepspeed`."""
    deepspeed = import_deepspeed(ctx.device.type)
    if ctx.backend is None:
        _group_of_one(ctx, timeout_s)
    _init_distributed(deepspeed, ctx.backend, timeout_s, shm_comm)
    return deepspeed


def init_deepspeed(shm_comm: bool = False, **init_kwargs) -> Context:
    """`exatrain.init(**init_kwargs)`, then `deepspeed.init_distributed` on the group exatrain joined.

    Returns exatrain's Context; afterwards call `deepspeed.initialize(model=..., config=...)` as usual.
    A single process gets a process group of one (DeepSpeed needs a group even then). `shm_comm=False`
    (default) skips the CPU shared-memory inference op (see SHM_COMM_OP): set True only for DeepSpeed
    tensor-parallel inference on CPUs.
    """
    import_deepspeed(init_kwargs.get("device", "auto"))  # before init: it picks DeepSpeed's accelerator
    ctx = init(**init_kwargs)
    try:
        attach_deepspeed(ctx, init_kwargs.get("timeout_s", 300.0), shm_comm)
    except BaseException:
        ctx._abort()
        raise
    return ctx


def _group_of_one(ctx: Context, timeout_s: float) -> None:
    backend = group_of_one(ctx.device, timeout_s)
    ctx.dist = type(ctx.dist)(env=ctx.dist.env, device=ctx.device, backend=backend)


def group_of_one(device: torch.device, timeout_s: float = 300.0) -> str:
    """A one-rank process group on an in-process store (no port, no rendezvous), for libraries that need a
    group even in a single process; returns its backend."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, store=dist.HashStore(), rank=0, world_size=1, timeout=datetime.timedelta(seconds=timeout_s)
    )
    # DeepSpeed's engine reads its local rank from the environment, as its launcher would have set it
    set_variables({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}, overwrite=False)
    return backend
