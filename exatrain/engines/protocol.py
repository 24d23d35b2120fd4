"""The Engine protocol: what the reference trainer drives, whatever runs the step.

Every engine (the trainer's own DataParallelEngine and PipelineEngine in train/, DeepSpeed and Horovod in
engines/) has:

    model_parts                  this rank's model chunks (one without pipeline parallel)
    num_params                   parameters of the whole model (all ranks together)
    train_step(micro_batches)    forward + backward over this rank's micro-batches, gradients ready for
                                 the optimizer (synchronised across data-parallel ranks); returns the
                                 rank's mean loss as a detached plain tensor
    eval_loss(x, y)              mean token loss of one batch (float), without gradients
    full_state_dict()            the whole model's unsharded state dict on rank 0 ({} elsewhere),
                                 loadable by a plain single-process model; a collective: call on all ranks

It lives here, above train/, so that an outside engine implements it without importing the trainer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from torch import nn
from torch.distributed.tensor.parallel import loss_parallel


class Engine:
    """What every engine shares: its model parts, autocast and the loss-parallel context."""

    #: True when the engine's own step also clips, steps the optimizer and the schedule (DeepSpeed); the
    #: trainer then does neither
    steps_optimizer: bool = False

    def checkpoint_model(self):
        """What the Checkpointer saves for this engine: None for the trainer's model (exatrain's own DCP
        checkpoints); an engine with its own checkpoint format returns the object that format saves."""
        return None

    def __init__(
        self,
        model_parts: list[nn.Module],
        num_params: int,
        use_loss_parallel: bool,
        autocast: Callable[[], contextlib.AbstractContextManager],
    ):
        self.model_parts, self.num_params = model_parts, num_params
        self.use_loss_parallel, self.autocast = use_loss_parallel, autocast

    def _loss_context(self):
        # cross_entropy on vocabulary-sharded logits needs torch's context in forward AND backward
        return loss_parallel() if self.use_loss_parallel else contextlib.nullcontext()

    def _context(self) -> contextlib.ExitStack:
        """Loss parallel, then autocast: around a forward (and around a pipeline schedule's whole step,
        whose backward runs inside the same call)."""
        stack = contextlib.ExitStack()
        stack.enter_context(self._loss_context())
        stack.enter_context(self.autocast())
        return stack

    def train(self, mode: bool = True) -> None:
        """Switch dropout (train) on or off (eval) in every model part."""
        for part in self.model_parts:
            part.train(mode)
