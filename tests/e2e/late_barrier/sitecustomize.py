"""Test hook (tests/e2e/test_agent_exit_barrier.py): in a torchrun agent started with LATE_BARRIER_WAIT=S, the
wait of torch's exit barrier starts S seconds after every agent has arrived (its last-member key is set),
which opens the window of pytorch/pytorch#69520 every time, whichever agent arrives last: the store's host,
free to go, leaves while this agent still has its wait to make. Workers (LOCAL_RANK set) are untouched."""

import os
import time

if os.environ.get("LATE_BARRIER_WAIT") and "LOCAL_RANK" not in os.environ:
    import torch.distributed.elastic.utils.store as store_util

    _barrier = store_util.barrier

    class _LateWait:
        def __init__(self, store):
            self._store = store

        def wait(self, keys, *args, **kwargs):
            while not self._store.check(keys):  # until the last agent has arrived
                time.sleep(0.05)
            time.sleep(float(os.environ["LATE_BARRIER_WAIT"]))
            return self._store.wait(keys, *args, **kwargs)

        def __getattr__(self, name):
            return getattr(self._store, name)

    def barrier(store, *args, **kwargs):
        return _barrier(_LateWait(store), *args, **kwargs)

    store_util.barrier = barrier
