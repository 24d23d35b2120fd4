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
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor.parallel import loss_parallel

from exatrain.distributed.parallelize import all_reduce_gradients, apply_ddp, gathered_state_dict, local_tensor


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


class DataParallelEngine(Engine):
    """One model per rank, wrapped for its layout (DDP, or already FSDP/TP-parallelised)."""

    def __init__(self, model: nn.Module, dims, device: torch.device, num_params: int, use_loss_parallel: bool,
                 autocast: Callable[[], contextlib.AbstractContextManager]):
        super().__init__([model], num_params, use_loss_parallel, autocast)
        self.model = model
        # DDP wraps last, after the weights are real (its constructor broadcasts rank 0's parameters);
        # torch's DDP takes no DTensors, so replicas of a TP model reduce gradients after backward instead
        self.ddp = apply_ddp(model, dims.mesh("dp"), device) if dims.ddp and not dims.tp_enabled else None
        self.replica_mesh = dims.mesh("dp") if dims.ddp and dims.tp_enabled else None

    def _sync_gradients(self, sync: bool):
        """Accumulate locally until the last micro-batch, then reduce gradients once."""
        if isinstance(self.model, FSDPModule):
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
        if self.replica_mesh is not None:
            all_reduce_gradients(self.model.parameters(), self.replica_mesh)
        return total

    @torch.no_grad()
    def eval_loss(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Mean token loss of one batch."""
        with self._context():
            return local_tensor(self.model(x, y)).item()

    def full_state_dict(self) -> dict:
        """The whole model, unsharded, on rank 0 (gathered across every parallel dimension)."""
        return full_state_dict(self.model)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Gather `model`'s parameters into plain CPU tensors on rank 0 ({} on other ranks); without a
    process group, a CPU copy of the state dict."""
    if not dist.is_initialized():
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    full = gathered_state_dict(model)  # collective: every rank takes part in each gather
    return full if dist.get_rank() == 0 else {}

