"""Gradient averaging of tensor-parallel replicas, attached to the model by `exatrain.parallelize`.

torch's DDP takes no DTensor parameters, so a tensor-parallel model replicated over several data-parallel
ranks without FSDP (layout "ddp" with tp > 1) cannot be DDP-wrapped. Instead its parameters get a hook
that queues one callback at the end of each backward; it averages the accumulated gradients over the
data-parallel mesh with one all-reduce on a flat buffer (all_reduce_gradients). The model gets FSDP's
method for gradient accumulation: `model.set_requires_gradient_sync(False)` on all micro-batches but the
last, so the reduction runs once per optimizer step, over the sum of the micro-batches' gradients.
"""

from __future__ import annotations

from torch import nn
from torch.autograd import Variable

from exatrain.distributed.parallelize import all_reduce_gradients


class ReplicaGradientSync:
    """Averages `params`' gradients over `dp_mesh` once at the end of each backward while enabled."""

    def __init__(self, params: list[nn.Parameter], dp_mesh):
        self.params, self.dp_mesh = params, dp_mesh
        self.enabled, self._queued = True, False
        for p in params:
            p.register_post_accumulate_grad_hook(self._on_grad)

    def set_requires_gradient_sync(self, requires_gradient_sync: bool) -> None:
        """False: gradients only accumulate locally (micro-batches before the last); True: the next
        backward ends with the average over the replicas."""
        self.enabled = bool(requires_gradient_sync)

    def _on_grad(self, _param) -> None:
        if self.enabled and not self._queued:
            self._queued = True
            # runs once, after the whole backward: every gradient of this step is accumulated by then
            Variable._execution_engine.queue_callback(self._reduce)

    def _reduce(self) -> None:
        self._queued = False
        all_reduce_gradients(self.params, self.dp_mesh)


def sync_replica_gradients(model: nn.Module, dp_mesh) -> nn.Module:
    """Make `model` average its gradients over `dp_mesh` after each backward (see the module docstring);
    adds `model.set_requires_gradient_sync(flag)` as FSDP2 modules have it."""
    sync = ReplicaGradientSync([p for p in model.parameters() if p.requires_grad], dp_mesh)
    model.set_requires_gradient_sync = sync.set_requires_gradient_sync
    return model
