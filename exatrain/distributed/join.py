"""Roll call before the process group forms: every rank checks in at the master's store, so that a join
timeout can name the ranks that never came instead of only saying that something timed out."""

from __future__ import annotations

import datetime
import socket
import time

import torch.distributed as dist

from exatrain.env import ClusterEnvironment
from exatrain.env.affinity import format_ranges
from exatrain.env.ports import EPHEMERAL_LOW, MIN_PORT
from exatrain.errors import ExatrainError

_HINT = (
    "check that every rank was started (the job's other nodes, `srun` errors in the job log), "
    "that the master "
    "address resolves to the first node from all nodes and the port is free; raise dist.timeout_s if nodes "
    "start slowly"
)
_HOST_HINT = (
    "another process on this node holds the port (see `ss -ltnp | grep :{port}`): set MASTER_PORT to a free "
    f"port from {MIN_PORT} to {EPHEMERAL_LOW - 1} in the job script, or submit again (exatrain derives the "
    "port from the job id)"
)


def roll_call(env: ClusterEnvironment, timeout_s: float) -> dist.Store:
    """Check in at the master's TCP store and wait until all ranks did; returns the store (the group reuses
    it).

    Rank 0 hosts the store (unless torchrun's agent shares its own: then every worker is a client) and waits
    for the others; on a timeout it publishes the missing ranks, and every rank raises an ExatrainError naming
    them.
    """
    where = f"{env.main_address}:{env.main_port}"
    store = _open_store(env, timeout_s)
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


def _open_store(env: ClusterEnvironment, timeout_s: float) -> dist.Store:
    """Rank 0 hosts the TCP store (unless the launcher does); the others connect once its port accepts."""
    hosts = env.global_rank == 0 and not env.launcher_hosts_store
    if not hosts and not _accepts_within(env.main_address, env.main_port, timeout_s):
        raise _unreachable(env, timeout_s, "nothing accepted a connection there")
    try:
        return dist.TCPStore(
            env.main_address,
            env.main_port,
            env.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
            is_master=hosts,
            wait_for_workers=False,
        )
    except (dist.DistError, RuntimeError) as e:
        cause = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        if not hosts:
            raise _unreachable(env, timeout_s, cause) from None
        raise ExatrainError(
            f"rank 0/{env.world_size} could not host the rendezvous store at "
            f"{env.main_address}:{env.main_port} ({cause})",
            _HOST_HINT.format(port=env.main_port),
        ) from None


def _unreachable(env: ClusterEnvironment, timeout_s: float, cause: str) -> ExatrainError:
    """The error of a rank whose store client found no master."""
    return ExatrainError(
        f"rank {env.global_rank}/{env.world_size} could not reach the master at "
        f"{env.main_address}:{env.main_port} within {timeout_s:g} s ({cause})",
        _HINT,
    )


def _accepts_within(host: str, port: int, timeout_s: float) -> bool:
    """Whether host:port accepts a TCP connection within timeout_s, polled with plain sockets.

    A store client does not connect before this says yes: torch's TCPStore client, given a master that never
    listens, tries once more after its own timeout (about twice timeout_s in all, measured with torch 2.13)
    and prints a C++ traceback per try, on every waiting rank."""
    deadline, pause = time.monotonic() + timeout_s, 0.05
    while (left := deadline - time.monotonic()) > 0:
        try:
            with socket.create_connection((host, port), timeout=min(left, 5.0)):
                return True
        except OSError:  # refused (not listening yet), unreachable, or this try timed out
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 1.0)
    return False


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
