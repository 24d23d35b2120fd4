"""Roll call before the process group forms: every rank checks in at the master's store, so that a join
timeout can name the ranks that never came instead of only saying that something timed out."""

from __future__ import annotations

import datetime
import time

import torch.distributed as dist

from exatrain.env import ClusterEnvironment
from exatrain.env.affinity import format_ranges
from exatrain.errors import ExatrainError

_HINT = (
    "check that every rank was started (the job's other nodes, `srun` errors in the job log), "
    "that the master "
    "address resolves to the first node from all nodes and the port is free; raise dist.timeout_s if nodes "
    "start slowly"
)


def roll_call(env: ClusterEnvironment, timeout_s: float) -> dist.Store:
    """Check in at the master's TCP store and wait until all ranks did; returns the store (the group reuses
    it).

    Rank 0 hosts the store (unless torchrun's agent shares its own: then every worker is a client) and waits
    for the others; on a timeout it publishes the missing ranks, and every rank raises an ExatrainError naming
    them.
    """
    where, seconds = f"{env.main_address}:{env.main_port}", datetime.timedelta(seconds=timeout_s)
    try:
        store = dist.TCPStore(
            env.main_address,
            env.main_port,
            env.world_size,
            timeout=seconds,
            is_master=env.global_rank == 0 and not env.launcher_hosts_store,
            wait_for_workers=False,
        )
    except (dist.DistError, RuntimeError) as e:
        raise ExatrainError(
            f"rank {env.global_rank}/{env.world_size} could not reach the master at {where} within "
            f"{timeout_s:g} s ({type(e).__name__}: {str(e).splitlines()[0]})",
            _HINT,
        ) from None
    prefix = f"exatrain/join/{env.job_id or '-'}/{env.restart_count}/"
    store.set(f"{prefix}rank/{env.global_rank}", env.hostname)
    store.add(f"{prefix}count", 1)
    verdict = (
        _wait_for_all(store, prefix, env.world_size, timeout_s)
        if env.global_rank == 0
        else _wait_for_verdict(store, prefix, timeout_s + 10)
    )
    if verdict != "ok":
        raise ExatrainError(
            f"rank {env.global_rank}/{env.world_size} could not join the process group at {where} "
            f"within {timeout_s:g} s: {verdict}",
            _HINT,
        )
    return store


def _wait_for_all(store: dist.Store, prefix: str, world: int, timeout_s: float) -> str:
    deadline, pause = time.monotonic() + timeout_s, 0.01
    while store.add(f"{prefix}count", 0) < world:
        if time.monotonic() > deadline:
            missing = [r for r in range(world) if not store.check([f"{prefix}rank/{r}"])]
            verdict = f"{len(missing)} of {world} ranks never checked in: {format_ranges(missing)}"
            store.set(f"{prefix}verdict", verdict)
            _linger(store, prefix, world - len(missing) - 1)
            return verdict
        time.sleep(pause)
        pause = min(pause * 2, 0.1)  # every rank waits on rank 0 seeing the last one: poll often
    store.set(f"{prefix}verdict", "ok")
    return "ok"


def _linger(store: dist.Store, prefix: str, readers: int, limit_s: float = 5.0) -> None:
    """Keep rank 0's store up until the ranks that came have read the failure verdict (at most limit_s)."""
    deadline = time.monotonic() + limit_s
    while store.add(f"{prefix}read", 0) < readers and time.monotonic() < deadline:
        time.sleep(0.05)


def _wait_for_verdict(store: dist.Store, prefix: str, timeout_s: float) -> str:
    try:
        store.wait([f"{prefix}verdict"], datetime.timedelta(seconds=timeout_s))
        verdict = store.get(f"{prefix}verdict").decode()
        store.add(f"{prefix}read", 1)
        return verdict
    except (dist.DistError, RuntimeError):
        return "rank 0 did not report that all ranks checked in (it failed or never came)"
