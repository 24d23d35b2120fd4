"""Choosing the rendezvous port: derived from the job so that jobs sharing a node do not collide."""

from __future__ import annotations

import hashlib

from exatrain.errors import ClusterEnvError

MIN_PORT = 1024
MAX_PORT = 65535
#: Linux's default ephemeral range starts here (net.ipv4.ip_local_port_range = 32768 60999): the kernel gives
#: these ports to outgoing connections (slurmd's, NFS's, other jobs' sockets) on its own, so a derived port
#: in that range can be taken on the node when rank 0 binds it ("address already in use")
EPHEMERAL_LOW = 32768


def derive_port(job_id: str, step_id: str | None = None, low: int = 20000, high: int = EPHEMERAL_LOW) -> int:
    """Map a job (and step) id to a port in ``[low, high)``, the same on every node of the job.

    The default range ends below the kernel's ephemeral ports (EPHEMERAL_LOW), which outgoing connections
    take without asking: up to 2026-11-27 it ran to 60000, and a CI job's rank 0 found its port held that way.

    Hashes the whole id with SHA-256 (Python's ``hash()`` is salted per process, so ranks would disagree);
    taking the last digits of the job id instead makes jobs 1001 and 11001 collide on a shared node.
    """
    if not MIN_PORT <= low < high <= MAX_PORT + 1:
        raise ValueError(f"need {MIN_PORT} <= low < high <= {MAX_PORT + 1}, got low={low}, high={high}")
    key = f"{job_id}.{step_id}" if step_id is not None else str(job_id)
    digest = hashlib.sha256(key.encode()).digest()
    return low + int.from_bytes(digest[:8], "big") % (high - low)


def check_port(value: object, source: str) -> int:
    """Parse ``value`` (from ``source``, e.g. ``MASTER_PORT``) as a TCP port a user process may bind."""
    try:
        port = int(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        port = None
    if port is None or not MIN_PORT <= port <= MAX_PORT:
        raise ClusterEnvError(
            f"{source}={value!r} is not a usable port",
            f"use an integer from {MIN_PORT} to {MAX_PORT} (ports below {MIN_PORT} need root), "
            "or leave it unset so exatrain derives one from the SLURM job id",
        )
    return port
