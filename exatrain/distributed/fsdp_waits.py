"""Time FSDP2's waits for its collectives, so that a rank with slow compute is named under FSDP too.

Why: under FSDP the other ranks wait for a slow rank at the next parameter gather (in the forward and in
the backward), not only at the end of backward, so their forward/backward time is the slow rank's and the
tail wait of `exatrain.backward` alone cannot tell them apart (observe/step_metrics.py, "straggler").

How: FSDP2 runs its collectives from three methods of its parameter group (one group per `fully_shard`
call): `pre_forward` and `pre_backward` gather the group's parameters (and prefetch the next group's),
`post_backward` reduce-scatters its gradients. Each is wrapped once per process in
`observe.backward_wait.collective_wait`: on the CPU (gloo) the host waits inside them, on a GPU the
compute stream waits for the communication stream there, which two CUDA events on the current stream
time. They are private methods of torch's FSDP2 (torch.distributed.fsdp._fully_shard._fsdp_param_group):
`tests/distributed/test_stragglers.py` pins them; where a torch lacks them nothing is wrapped and the
straggler accounting of FSDP runs sees only backward's tail, as before.
"""

from __future__ import annotations

import functools

from exatrain.observe import backward_wait

#: the FSDP2 parameter-group methods that wait for collectives
WAITING_METHODS = ("pre_forward", "pre_backward", "post_backward")


def time_fsdp_waits() -> bool:
    """Wrap FSDP2's waiting methods (once per process); False where this torch's FSDP2 lacks them."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    except ImportError:
        return False
    methods = [getattr(FSDPParamGroup, name, None) for name in WAITING_METHODS]
    if not all(callable(m) for m in methods):
        return False
    for name, method in zip(WAITING_METHODS, methods):
        if not getattr(method, "_exatrain_timed", False):
            setattr(FSDPParamGroup, name, _timed(method))
    return True


def _timed(method):
    @functools.wraps(method)
    def timed(self, *args, **kwargs):
        with backward_wait.collective_wait(self.device.type == "cuda"):
            return method(self, *args, **kwargs)

    timed._exatrain_timed = True
    return timed
