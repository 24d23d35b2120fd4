"""torchrun's exit-barrier race (pytorch/pytorch#69520), closed for the agents exatrain runs.

After a successful run every agent waits in torch's exit barrier, then closes the rendezvous; both talk to the
TCPStore that one agent hosts. That agent leaves as soon as the barrier lets it, and its store goes with it,
while another agent may still be waiting in the barrier or closing the rendezvous: that agent then logs
"Error waiting on exit barrier" with a traceback and "failed to shutdown the rendezvous", after a job that
finished well (seen in exatrain's own multi-node CI).

Here, after a successful exit barrier, each agent closes the rendezvous and then counts itself out in the
store; the agent that hosts the store waits until every agent has counted itself out (at most LINGER_S)
before it leaves. Failed or signalled runs are untouched (torch calls no exit barrier there), so is a barrier
that timed out (an agent is missing: nobody to wait for), and so is a torch without these pieces (the patch
is then skipped, and torch behaves as it did).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

LINGER_S = 60.0  # the longest the store's host waits for the other agents to leave (they need milliseconds)
POLL_S = 0.05
LEFT_KEY = "exatrain/agents_left"


def install() -> bool:
    """Patch torch's elastic agent in this process (the agent's own); False where the torch lacks the pieces
    (then nothing changes)."""
    try:
        from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler
    except ImportError:
        return False
    if not hasattr(SimpleElasticAgent, "_exit_barrier") or getattr(SimpleElasticAgent, "_exatrain", False):
        return False
    exit_barrier, shutdown = SimpleElasticAgent._exit_barrier, DynamicRendezvousHandler.shutdown

    def _exit_barrier(agent):
        started = time.monotonic()
        exit_barrier(agent)  # logs and swallows its own errors: a barrier that timed out took its timeout
        if time.monotonic() - started < getattr(agent, "_exit_barrier_timeout", 300):
            try:
                handler = agent._worker_group.spec.rdzv_handler
                handler._exatrain_agents = agent._worker_group.group_world_size  # the job's agents (nodes)
            except AttributeError:  # another torch's layout: leave as torch would
                pass

    def _shutdown(handler):
        closed = shutdown(handler)
        agents, store = getattr(handler, "_exatrain_agents", 0), getattr(handler, "_store", None)
        if agents and store is not None:
            leave(store, agents, hosts_store(store))
        return closed

    SimpleElasticAgent._exit_barrier = _exit_barrier
    DynamicRendezvousHandler.shutdown = _shutdown
    SimpleElasticAgent._exatrain = True
    return True


def leave(store, agents: int, host: bool, linger_s: float = LINGER_S) -> None:
    """Count this agent out; the store's host then waits until all `agents` have (at most `linger_s`), so
    that its store outlives every other agent's last request."""
    try:
        left = store.add(LEFT_KEY, 1)
        deadline = time.monotonic() + linger_s
        while host and left < agents and time.monotonic() < deadline:
            time.sleep(POLL_S)
            left = store.add(LEFT_KEY, 0)
    except Exception:  # the store is already gone: nothing left to protect
        pass


def hosts_store(store) -> bool:
    """Whether this process listens on the store's port (it hosts the TCPStore server), read from /proc:
    torch has no public way to ask a TCPStore whether it is the server."""
    try:
        port = _tcp_store(store).port
    except (AttributeError, RuntimeError):
        return False
    return bool(listening_inodes(port) & own_socket_inodes())


def _tcp_store(store):
    """The TCPStore under PrefixStore wrappers (or None)."""
    while store is not None and not hasattr(store, "port"):
        store = getattr(store, "underlying_store", None)
    return store


def listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on TCP `port` (IPv4 and IPv6) on this host's network namespace."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(inode)
    return inodes


def own_socket_inodes() -> set[str]:
    """Inodes of the sockets this process holds open."""
    inodes = set()
    try:
        fds = list(Path("/proc/self/fd").iterdir())
    except OSError:  # no /proc: then no agent here is known to host the store, and none waits
        return inodes
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes
