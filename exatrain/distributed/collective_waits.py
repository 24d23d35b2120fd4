"""Time the waits for collectives inside the forward and backward, so that a rank with slow compute is named
under FSDP and tensor parallelism too.

Why: under DDP the other ranks wait for a slow rank at the end of backward, which `exatrain.backward`
times (observe/backward_wait.py). Under FSDP they wait at the next parameter gather, under tensor
parallelism at the next all-reduce or gather of activations, in the forward and in the backward: their
forward/backward time is the slow rank's, and the tail wait alone cannot tell them apart
(observe/step_metrics.py, "straggler").

How: each wait is wrapped in `observe.backward_wait.collective_wait` (host clock on the CPU, two CUDA events
around the compute stream's wait on a GPU), once per process:
- FSDP2 runs its collectives from three methods of its parameter group (one group per `fully_shard`):
  `pre_forward` and `pre_backward` gather the group's parameters (and prefetch the next group's),
  `post_backward` reduce-scatters its gradients (`time_fsdp_waits`).
- Tensor parallelism (DTensor) issues functional collectives and waits for each in
  `torch.distributed._functional_collectives.wait_tensor`, at the first use of its result
  (`time_tp_waits`); inside torch.compile'd code it is left alone (no timing in a traced graph).
Both are private parts of torch: `tests/unit/test_backward_wait.py` pins them; where a torch lacks them
nothing is wrapped and the straggler accounting sees backward's tail only, as before.
"""

from __future__ import annotations

import functools

import torch

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
            setattr(FSDPParamGroup, name, _timed_method(method))
    return True


def time_tp_waits() -> bool:
    """Wrap the functional collectives' `wait_tensor` (once per process); False where torch lacks it."""
    try:
        from torch.distributed import _functional_collectives as funcol
    except ImportError:
        return False
    wait = getattr(funcol, "wait_tensor", None)
    if not callable(wait):
        return False
    if not getattr(wait, "_exatrain_timed", False):
        funcol.wait_tensor = _timed_wait(wait)
    return True


def _timed_method(method):
    @functools.wraps(method)
    def timed(self, *args, **kwargs):
        with backward_wait.collective_wait(self.device.type == "cuda"):
            return method(self, *args, **kwargs)

    timed._exatrain_timed = True
    return timed


def _timed_wait(wait):
    @functools.wraps(wait)
    def timed(tensor):
        if torch.compiler.is_compiling():
            return wait(tensor)
        with backward_wait.collective_wait(tensor.is_cuda):
            return wait(tensor)

    timed._exatrain_timed = True
    return timed
