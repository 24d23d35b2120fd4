"""Test hook (tests/e2e/test_agent_exit_barrier.py): in a torchrun agent started with LATE_BARRIER_WAIT=S and
LATE_BARRIER_PORT=P, the wait of torch's exit barrier starts only once every agent has arrived (its
last-member key is set) and then the rendezvous store on 127.0.0.1:P has gone, or S seconds have passed
without it going. That opens the window of pytorch/pytorch#69520 every time, whichever agent arrives last and
however slowly the machine runs: a store host free to go leaves while this agent still has its wait to make;
one that stays (exatrain's agent) costs this agent S seconds. Workers (LOCAL_RANK set) are untouched."""

import os
import socket
import time

if os.environ.get("LATE_BARRIER_WAIT") and "LOCAL_RANK" not in os.environ:
    import torch.distributed.elastic.utils.store as store_util

    _barrier = store_util.barrier

    def _store_gone(port: int) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) != 0

    class _LateWait:
        def __init__(self, store):
            self._store = store

        def wait(self, keys, *args, **kwargs):
            while not self._store.check(keys):  # until the last agent has arrived
                time.sleep(0.05)
            deadline = time.monotonic() + float(os.environ["LATE_BARRIER_WAIT"])
            port = int(os.environ["LATE_BARRIER_PORT"])
            while time.monotonic() < deadline and not _store_gone(port):
                time.sleep(0.05)
            return self._store.wait(keys, *args, **kwargs)

        def __getattr__(self, name):
            return getattr(self._store, name)

    def barrier(store, *args, **kwargs):
        return _barrier(_LateWait(store), *args, **kwargs)

    store_util.barrier = barrier
