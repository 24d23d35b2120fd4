"""Engines: how one rank runs forward/backward of an optimizer step and an evaluation forward.

The trainer only talks to an engine (the protocol in exatrain/engines/protocol.py), so a layout changes the
engine, not the loop.

`DataParallelEngine` covers every layout without pipeline parallel (single process, DDP, FSDP, HSDP,
TP, TP + SP / loss parallel, and their combinations).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

import exatrain
from exatrain.engines.protocol import Engine


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (under loss parallel: the whole, replicated value); a plain tensor as
    is."""
    return t.to_local() if isinstance(t, DTensor) else t


class DataParallelEngine(Engine):
    """One model per rank, parallelised for its layout by exatrain.parallelize (DDP-wrapped, or FSDP/TP;
    replicas of a TP model average their gradients at the end of backward, as parallelize set up)."""

    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        num_params: int,
        use_loss_parallel: bool,
        autocast: Callable[[], contextlib.AbstractContextManager],
    ):
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
        """Forward and backward over this rank's micro-batches (gradient accumulation); returns their mean
        loss."""
        forward = self.ddp or self.model
        total = torch.zeros((), device=micro_batches[0][0].device)
        for i, (x, y) in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            with self._sync_gradients(last), self._loss_context():
                with self.autocast():
                    loss = forward(x, y) / len(micro_batches)
                if last:  # the one backward that waits for the other ranks: time that wait (StepMetrics)
                    exatrain.backward(loss)
                else:
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
