"""The network interfaces of this node, and which of the interfaces a job names for gloo exist here.

gloo (torch.distributed's CPU backend) creates one device per name in ``GLOO_SOCKET_IFNAME`` and fails on the
first one the node does not have ("Unable to find address for: ib1"); NCCL_SOCKET_IFNAME is a prefix list and
tolerates missing names. A site profile names every interface a node of the site may have (JUWELS Booster:
``ib0``; LUMI-G: ``hsn0..hsn3``), so each rank keeps only those its own node has (`gloo_interfaces`), and a
list of which the node has none is an error naming the interfaces and the node, before any rank waits for a
rendezvous. Stdlib only; reads /sys/class/net (``root`` lets tests point at a fake tree).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from exatrain.errors import ClusterEnvError

GLOO_IFNAME = "GLOO_SOCKET_IFNAME"


def node_interfaces(root: str = "/") -> set[str]:
    """Names of this node's network interfaces (as /sys/class/net lists them: lo, eth0, ib0, hsn0, ...)."""
    try:
        return {entry.name for entry in (Path(root) / "sys/class/net").iterdir()}
    except OSError:
        return set()


def present_interfaces(wanted: str, present: set[str]) -> tuple[list[str], list[str]]:
    """Split the comma-separated list ``wanted`` into (names the node has, names it lacks), in list order."""
    names = [n.strip() for n in wanted.split(",") if n.strip()]
    return [n for n in names if n in present], [n for n in names if n not in present]


def gloo_interfaces(environ: Mapping[str, str], hostname: str, root: str = "/") -> str | None:
    """The value GLOO_SOCKET_IFNAME should have on this node: the listed interfaces it has (None where the
    variable is unset or every name exists, so nothing needs to change). Raises ClusterEnvError, naming the
    interfaces and the node, where it has none of them: gloo would fail on the first, or the job would talk
    over a network it was told not to use."""
    wanted = environ.get(GLOO_IFNAME, "").strip()
    if not wanted:
        return None
    present = node_interfaces(root)
    if not present:  # no /sys/class/net to read (not Linux): leave the choice to gloo
        return None
    kept, missing = present_interfaces(wanted, present)
    if not missing:
        return None
    if not kept:
        others = ", ".join(sorted(present - {"lo"})) or "only lo"
        raise ClusterEnvError(
            f"{GLOO_IFNAME}={wanted}: node {hostname} has none of these network interfaces "
            f"(it has: {others}); "
            "gloo would fail with 'Unable to find address for: " + missing[0] + "'",
            f"name interfaces node {hostname} has in the profile's [comm_env] {GLOO_IFNAME} (or the job's "
            f"[job.env]); `ls /sys/class/net` on a compute node lists them",
        )
    return ",".join(kept)


def main() -> int:
    """``python3 -m exatrain.env.nics``: print the GLOO_SOCKET_IFNAME this node should use (the batch script
    of torchrun mode exports it on each node before torchrun starts); exit 1 with the error and a HINT where
    the node has none of the listed interfaces."""
    try:
        narrowed = gloo_interfaces(os.environ, socket.gethostname())
    except ClusterEnvError as e:
        print(f"exatrain: ERROR: {e}", file=sys.stderr)
        return 1
    print(narrowed or os.environ.get(GLOO_IFNAME, ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
