"""Hang-proof start: master addresses that cannot work are refused before any rank waits for them.

Without these checks a multi-node job whose master address is wrong does not fail, it waits: every rank
sits in rendezvous until the join timeout (minutes). The classic causes are ``MASTER_ADDR=$(hostname)``
evaluated on every node (each node then waits for itself; this is what a missing ``scontrol`` inside a
container leads to), ``localhost``, and a name that does not resolve (a wrong site suffix).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

from exatrain.env.base import ClusterEnvironment, resolve_host
from exatrain.errors import ClusterEnvError

_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
_UNSET_HINT = (
    "unset MASTER_ADDR: exatrain derives it from the job's node list itself (its first host; no "
    "scontrol needed, so it works in containers); if you must export it, do so once in the batch script "
    "before srun, as the first host of $SLURM_JOB_NODELIST"
)


def check_master(env: ClusterEnvironment, resolve: Callable[[str], str] = resolve_host) -> None:
    """Raise ClusterEnvError (naming the cause, with a HINT) when ``env``'s master address cannot work.

    Checked for jobs of several ranks: on several nodes, a loopback master or a master that is this node's
    own name while this rank is not on the first node; always, a master name that does not resolve.
    ``resolve`` is injectable for tests; it raises ClusterEnvError for names it cannot resolve.
    """
    if not env.is_distributed:
        return
    address = env.main_address
    where = f"rank {env.global_rank}" + (
        f" on node {env.node_rank} of {env.num_nodes}" if env.num_nodes else ""
    )
    if env.spans_nodes and _is_loopback(address):
        raise ClusterEnvError(
            f"master address {address!r} is a loopback address, but the job spans "
            f"{f'{env.num_nodes} nodes' if env.num_nodes else 'several nodes'} ({where}): ranks "
            "on other nodes "
            "can never reach it and would wait until the join timeout",
            _UNSET_HINT,
        )
    # Needs this rank's node index; where the launcher does not say it (MPI), the check is left out rather
    # than guessed.
    if env.spans_nodes and env.node_rank not in (None, 0) and _same_host(address, env.hostname):
        raise ClusterEnvError(
            f"master address {address!r} is this node's own host name, but {where} is not on the first node: "
            "each node would wait for a master on itself (MASTER_ADDR=$(hostname) evaluated on every node, "
            "or scontrol missing inside a container)",
            _UNSET_HINT,
        )
    resolve(address)


def _is_loopback(address: str) -> bool:
    if address.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _same_host(address: str, hostname: str) -> bool:
    """Same machine name, comparing short names (node1 == node1.cluster.local)."""
    return address.split(".")[0].lower() == hostname.split(".")[0].lower() and not _is_ip(address)


def _is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
        return True
    except ValueError:
        return False
