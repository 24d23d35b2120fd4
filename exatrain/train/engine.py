"""Engines: how one rank runs forward/backward of an optimizer step and an evaluation forward.

The trainer only talks to an engine, so a layout changes the engine, not the loop. Every engine has:

    model_parts                  this rank's model chunks (one without pipeline parallel)
    num_params                   parameters of the whole model (all ranks together)
    train_step(micro_batches)    forward + backward over this rank's micro-batches, gradients ready for
                                 the optimizer (synchronised across data-parallel ranks); returns the
                                 rank's mean loss as a detached plain tensor
    eval_loss(x, y)              mean token loss of one batch (float), without gradients
    full_state_dict()            the whole model's unsharded state dict on rank 0 ({} elsewhere),
                                 loadable by a plain single-process model; a collective: call on all ranks

`DataParallelEngine` covers every layout without pipeline parallel (single process, DDP, FSDP, HSDP,
TP, TP + SP / loss parallel, and their combinations).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel
from torch.nn.parallel import DistributedDataParallel

import exatrain


class Engine:
    """What every engine shares: its model parts, autocast and the loss-parallel context."""

    def __init__(self, model_parts: list[nn.Module], num_params: int, use_loss_parallel: bool,
                 autocast: Callable[[], contextlib.AbstractContextManager]):
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


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (under loss parallel: the whole, replicated value); a plain tensor as is."""
    return t.to_local() if isinstance(t, DTensor) else t


class DataParallelEngine(Engine):
    """One model per rank, parallelised for its layout by exatrain.parallelize (DDP-wrapped, or FSDP/TP;
    replicas of a TP model average their gradients at the end of backward, as parallelize set up)."""

    def __init__(self, model: nn.Module, device: torch.device, num_params: int, use_loss_parallel: bool,
                 autocast: Callable[[], contextlib.AbstractContextManager]):
        # model parts, optimizer and checkpoints use the plain model; forward in training goes through DDP
        self.ddp = model if isinstance(model, DistributedDataParallel) else None
        model = self.ddp.module if self.ddp is not None else model
        super().__init__([model], num_params, use_loss_parallel, autocast)
        self.model = model

    def _sync_gradients(self, sync: bool):
        """Accumulate locally until the last micro-batch, then reduce gradients once."""
        if hasattr(self.model, "set_requires_gradient_sync"):  # FSDP2, or TP replicas (exatrain.parallelize)
            self.model.set_requires_gradient_sync(sync)
        if self.ddp is not None and not sync:
            return self.ddp.no_sync()
        return contextlib.nullcontext()

    def train_step(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Forward and backward over this rank's micro-batches (gradient accumulation); returns their mean loss."""
        forward = self.ddp or self.model
        total = torch.zeros((), device=micro_batches[0][0].device)
        for i, (x, y) in enumerate(micro_batches):
            with self._sync_gradients(i == len(micro_batches) - 1), self._loss_context():
                with self.autocast():
                    loss = forward(x, y) / len(micro_batches)
                loss.backward()
            total += local_tensor(loss.detach())  # replicated DTensor under loss parallel: the full value
        return total

    @torch.no_grad()
    def eval_loss(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Mean token loss of one batch."""
        with self._context():
            return local_tensor(self.model(x, y)).item()

    def full_state_dict(self) -> dict:
        """The whole model, unsharded, on rank 0 (gathered across every parallel dimension)."""
        return exatrain.full_state_dict(self.model)

