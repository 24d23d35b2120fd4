"""Process group set-up and teardown: device per local rank, backend by device, timeouts.

This is the only module that writes communication variables (MASTER_ADDR, MASTER_PORT, RANK, ...):
the cluster environment was read once by `exatrain.env`, and c10d's env:// init reads them back.
"""

from __future__ import annotations

import datetime
import gc
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from exatrain.distributed.collectives import all_gather_objects
from exatrain.distributed.join import roll_call
from exatrain.distributed.variables import flight_recorder_variables, set_variables
from exatrain.env import ClusterEnvironment
from exatrain.env.base import node_layout
from exatrain.env.devices import pick_device_index, visibility_problem
from exatrain.env.master_check import check_master
from exatrain.env.nics import GLOO_IFNAME, gloo_interfaces
from exatrain.errors import ConfigError, ExatrainError
from exatrain.observe import heartbeat
from exatrain.observe.step_metrics import device_name


@dataclass(frozen=True)
class DistContext:
    """What a rank knows after set-up: its place in the job, its device and the backend in use."""

    env: ClusterEnvironment
    device: torch.device
    backend: str | None  # None when running as a single process without a group

    @property
    def rank(self) -> int:
        return self.env.global_rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def is_root(self) -> bool:
        return self.env.global_rank == 0


def select_device(env: ClusterEnvironment, requested: str = "auto") -> torch.device:
    """The device of this rank: its GPU when one is visible (by local rank, unless SLURM already
    narrowed visibility to one device per task), else the CPU."""
    if requested not in ("auto", "cuda", "cpu"):
        raise ConfigError(
            f"train.device must be auto, cuda or cpu, got {requested!r}", "use --train.device=auto"
        )
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ExatrainError(
            "train.device=cuda but torch sees no GPU",
            f"check that this torch build has CUDA/ROCm (torch {torch.__version__}) and that the "
            "job requested GPUs",
        )
    index = pick_device_index(env.local_rank, env.local_world_size, torch.cuda.device_count())
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def select_backend(device: torch.device, requested: str = "auto") -> str:
    """nccl for GPUs (RCCL on ROCm builds answers to the same name), gloo for CPUs."""
    if requested == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if requested not in ("nccl", "gloo"):
        raise ConfigError(
            f"dist.backend must be auto, nccl or gloo, got {requested!r}", "use --dist.backend=auto"
        )
    if requested == "nccl" and device.type != "cuda":
        raise ConfigError(
            "dist.backend=nccl needs GPUs, but this rank runs on the CPU", "use --dist.backend=gloo or auto"
        )
    return requested


def init_distributed(
    env: ClusterEnvironment, device: str = "auto", backend: str = "auto", timeout_s: float = 300.0
) -> DistContext:
    """Pick this rank's device and, for more than one rank, join the process group.

    A master address that cannot work (loopback or this node's own name on a non-first node of a multi-node
    job, or unresolvable) fails at once; joining is bounded by `timeout_s`, and a timeout becomes an error
    naming the master address, port and the ranks that never checked in.
    """
    problem = visibility_problem(os.environ)
    if problem:
        print(f"[rank {env.global_rank}] WARNING: {problem}", file=sys.stderr, flush=True)
    dev = select_device(env, device)
    heartbeat.set_device(device_name(dev) if dev.type == "cuda" else None)
    chosen = select_backend(dev, backend)
    if not env.is_distributed:
        return DistContext(env=env, device=dev, backend=None)
    check_master(env)  # a master that cannot work fails now, not after timeout_s of waiting
    gloo = gloo_interfaces(os.environ, env.hostname)  # gloo fails on a listed interface this node lacks
    if gloo:
        set_variables({GLOO_IFNAME: gloo})
    set_variables(flight_recorder_variables(os.environ, chosen))  # read when the NCCL group starts
    _export_rendezvous(env)
    store = roll_call(env, timeout_s)
    dist.init_process_group(
        backend=chosen,
        # torchrun's agent may host the store its workers share (env:// finds it); elsewhere (also under
        # torchrun with store sharing off) rank 0's roll-call store is the group's store, so no second
        # server is started on the same port.
        **({"init_method": "env://"} if env.launcher_hosts_store else {"store": store}),
        rank=env.global_rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=dev if dev.type == "cuda" else None,
    )
    if env.node_rank is None:  # the launcher did not say (MPI): learn it from every rank's host name
        env = env.with_node_layout(*node_layout(all_gather_objects(env.hostname), env.global_rank))
    return DistContext(env=env, device=dev, backend=chosen)


def _export_rendezvous(env: ClusterEnvironment) -> None:
    # c10d's env:// reads these. torchrun's agent already set them (and hosts the store on its
    # MASTER_PORT), so they are left exactly as the agent wrote them.
    if env.kind == "torchelastic":
        return
    os.environ["MASTER_ADDR"] = env.main_address
    os.environ["MASTER_PORT"] = str(env.main_port)
    os.environ["RANK"] = str(env.global_rank)
    os.environ["WORLD_SIZE"] = str(env.world_size)
    os.environ["LOCAL_RANK"] = str(env.local_rank)
    os.environ["LOCAL_WORLD_SIZE"] = str(env.local_world_size)


def teardown() -> None:
    """Leave the process group cleanly: wait for in-flight work, then free the group.

    A finished Trainer still holds the group through a reference cycle (its TrainingState keeps bound
    methods of it; the trainer holds the DDP model, whose reducer holds the group), so destroying the group
    used to leave gloo's native threads running into interpreter shutdown. Collecting such cycles first
    lets destroy_process_group drop the group's last reference and join those threads here.
    """
    if dist.is_initialized():
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
