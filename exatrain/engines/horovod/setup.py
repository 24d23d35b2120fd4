"""Horovod on exatrain's launch path: `hvd.init()` fed from exatrain's environment, never `horovodrun`.

Horovod's gloo controller finds its peers through an HTTP rendezvous that `horovodrun` normally hosts.
Here rank 0 hosts it (horovod.runner's RendezvousServer), the slot plan (rank, local rank, node index of
every rank) comes from exatrain's detected environment, the server's port travels over exatrain's process
group, and each rank gets the HOROVOD_* variables horovodrun would have set.

Same role as engines/deepspeed/setup.py: each engine package has its setup.py.
"""

from __future__ import annotations

import socket

import torch.distributed as dist

from exatrain.distributed.variables import set_variables
from exatrain.errors import ExatrainError


def import_horovod():
    """horovod.torch, or an error saying how to build it."""
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        raise ExatrainError(
            f"Horovod is not installed in this environment ({exc})",
            "bash scripts/install.sh horovod (builds Horovod 0.28.1 for this torch, ~8 min once)",
        ) from exc
    return hvd


def init_horovod(ctx):
    """`exatrain.init_horovod`: start Horovod on every rank of the process group of `ctx` (exatrain.init), as
    `horovodrun` would have (its rendezvous on rank 0, the HOROVOD_* variables from exatrain's detected
    environment), so a Horovod script runs under srun, mpirun, torchrun or `exatrain run`, or as a single
    plain process (Horovod of size 1). A collective; returns horovod.torch (`hvd.DistributedOptimizer`,
    `hvd.broadcast_parameters`, ... as usual)."""
    hvd = import_horovod()
    env = ctx.env
    me = (socket.gethostname(), env.global_rank, env.local_rank, env.local_world_size)
    grouped = dist.is_available() and dist.is_initialized()  # a single plain process has no group to ask
    ranks = [me]
    if grouped:
        ranks = [None] * env.world_size
        dist.all_gather_object(ranks, me)
    hosts = list(dict.fromkeys(h for h, *_ in ranks))  # node order of first appearance
    port = [_start_rendezvous(ranks, hosts) if env.global_rank == 0 else None]
    if grouped:
        dist.broadcast_object_list(port, src=0)
    set_variables({"HOROVOD_CPU_OPERATIONS": "gloo"}, overwrite=False)
    set_variables(
        {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": env.main_address if len(hosts) > 1 else "127.0.0.1",
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port[0]),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_HOSTNAME": me[0],
            "HOROVOD_RANK": str(env.global_rank),
            "HOROVOD_SIZE": str(env.world_size),
            "HOROVOD_LOCAL_RANK": str(env.local_rank),
            "HOROVOD_LOCAL_SIZE": str(env.local_world_size),
            "HOROVOD_CROSS_RANK": str(hosts.index(me[0])),
            "HOROVOD_CROSS_SIZE": str(len(hosts)),
        }
    )
    if len(hosts) == 1:
        set_variables({"HOROVOD_GLOO_IFACE": "lo"}, overwrite=False)
    hvd.init()
    return hvd


def _start_rendezvous(ranks: list[tuple], hosts: list[str]) -> int:
    from horovod.runner.common.util.hosts import SlotInfo
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer(verbose=0)
    port = server.start()
    server.init(
        [
            SlotInfo(
                hostname=h,
                rank=r,
                local_rank=lr,
                cross_rank=hosts.index(h),
                size=len(ranks),
                local_size=ls,
                cross_size=len(hosts),
            )
            for h, r, lr, ls in sorted(ranks, key=lambda x: x[1])
        ]
    )
    return port
