"""exatrain/launch/exit_barrier.py's parts on a real TCPStore in this process: which process hosts the store,
and the host waiting until every agent has counted itself out (tests/e2e/test_agent_exit_barrier.py runs
the whole on two real agents)."""

import threading

import torch.distributed as dist

from exatrain.launch import exit_barrier
from tests.ports import free_port


def _server():
    return dist.TCPStore("127.0.0.1", free_port(), is_master=True, wait_for_workers=False)


def test_the_process_listening_on_the_stores_port_hosts_it():
    server = _server()
    assert exit_barrier.hosts_store(server)
    assert exit_barrier.hosts_store(dist.PrefixStore("torch.rendezvous.x", server))  # through a prefix
    assert not exit_barrier.hosts_store(object())  # no TCPStore under it: not a host, nobody waits


def test_the_host_leaves_after_the_last_agent_has_counted_itself_out():
    server = _server()
    added = threading.Event()

    def other_agent():
        threading.Event().wait(0.3)
        added.set()
        server.add(exit_barrier.LEFT_KEY, 1)

    thread = threading.Thread(target=other_agent)
    thread.start()
    exit_barrier.leave(server, agents=2, host=True)
    assert added.is_set() and server.add(exit_barrier.LEFT_KEY, 0) == 2
    thread.join()


def test_a_missing_agent_holds_the_host_only_for_the_bound():
    server = _server()
    exit_barrier.leave(server, agents=3, host=True, linger_s=0.2)  # returns: nobody else comes
    assert server.add(exit_barrier.LEFT_KEY, 0) == 1
    exit_barrier.leave(server, agents=3, host=False)  # a non-host counts itself out and goes
    assert server.add(exit_barrier.LEFT_KEY, 0) == 2
