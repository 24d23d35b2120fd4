"""TCP ports for tests that start a rendezvous or need a port nobody listens on, without races.

Asking the kernel for a free port (bind to 0, close, hand the number on) races: until the test's rendezvous
binds it, the kernel may give the same port to any other socket, and the two pytest-xdist workers (and the
gloo connections of their ranks) take ephemeral ports all the time. Instead each xdist worker draws from its
own block of ports below Linux's ephemeral range (32768-60999, net.ipv4.ip_local_port_range; the kernel
never assigns these on its own) and clear of the SLURM test cluster's ports (16817-18500) and of the
rendezvous ports exatrain derives from SLURM job ids (20000-32767): gw0 12000-12499, gw1 12500-12999, ...,
a run without xdist 15500-15999. Within a block the ports are handed out in turn (none twice within 500
calls), starting at an offset taken from the pid, and one that is in use (another session on the machine)
is skipped.
"""

from __future__ import annotations

import itertools
import os
import socket

BASE, BLOCK, BLOCKS = 12000, 500, 8


def _block() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ... under xdist
    index = int(worker[2:]) % (BLOCKS - 1) if worker.startswith("gw") else BLOCKS - 1
    start = BASE + index * BLOCK
    return range(start, start + BLOCK)


def _in_use(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))  # all addresses, as torch's TCPStore server binds
        except OSError:
            return True
    return False


_ports = None


def free_port() -> int:
    """A port of this worker's block that is free now and was not handed out in this worker recently."""
    global _ports
    block = _block()
    if _ports is None:
        offset = os.getpid() % len(block)
        _ports = itertools.cycle([*block[offset:], *block[:offset]])
    for _ in range(len(block)):
        port = next(_ports)
        if not _in_use(port):
            return port
    raise RuntimeError(f"every port of {block} is in use")
