"""`[engine] name = "horovod"`: the reference model trained with Horovod's DistributedOptimizer.

Ranks are started by exatrain (srun, torchrun, `exatrain train --nproc`), Horovod is initialised from
exatrain's environment (engines/horovod/setup.py). Rank 0's parameters and optimizer state are
broadcast, gradients are averaged by Horovod's allreduce after the last micro-batch of a step
(backward_passes_per_step), then clipped and stepped here. Checkpoints are exatrain's own (DCP) of the
unwrapped model and the optimizer.

Same role as engines/deepspeed/engine.py: each engine package has its engine.py.
"""

from __future__ import annotations

import contextlib

import torch

import exatrain
from exatrain.config import Config
from exatrain.engines.optim import build_optimizer, build_scheduler
from exatrain.engines.protocol import Engine
from exatrain.observe import backward_wait


class HorovodEngine(Engine):
    """One plain model per rank; `train_step` also clips and steps the optimizer and schedule."""

    steps_optimizer = True

    def __init__(
        self, cfg: Config, ctx: exatrain.Context, reference: torch.nn.Module, accumulation: int, autocast
    ):
        hvd = exatrain.init_horovod(ctx)
        self.model = reference.to(ctx.device)
        base = build_optimizer(self.model, cfg.train)
        self.optimizer = hvd.DistributedOptimizer(
            base, named_parameters=self.model.named_parameters(), backward_passes_per_step=accumulation
        )
        self.scheduler = build_scheduler(self.optimizer, cfg.train)
        # torch's optimizer-state loading (DCP, on resume) calls zero_grad(set_to_none=True), which Horovod's
        # zero_grad() does not take: accept it and keep Horovod's behaviour (gradients zeroed, not freed)
        hvd_zero_grad = self.optimizer.zero_grad
        self.optimizer.zero_grad = lambda set_to_none=False: hvd_zero_grad()
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        # a fresh optimizer has no state to share, and Horovod would create it by a step with zero gradients,
        # which AdamW's decoupled weight decay turns into a real update: broadcast only a state that exists
        if self.optimizer.state_dict()["state"]:
            hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)
        self.clip, self.grad_norm = cfg.train.grad_clip, None
        super().__init__([self.model], reference.num_params(), False, autocast)

    def train_step(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Forward/backward per micro-batch, Horovod's allreduce, clipping, optimizer and schedule step."""
        total = torch.zeros((), device=micro_batches[0][0].device)
        for x, y in micro_batches:
            with self.autocast():
                loss = self.model(x, y) / len(micro_batches)
            loss.backward()
            total += loss.detach()
        with backward_wait.waiting():  # the wait for the others, for the straggler accounting
            self.optimizer.synchronize()  # gradients averaged over the ranks
        if self.clip > 0:
            self.grad_norm = exatrain.clip_grad_norm_(self.model, self.clip)
        with self.optimizer.skip_synchronize():
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad()  # Horovod's keeps gradient tensors (its hooks hold them)
        return total

    @torch.no_grad()
    def eval_loss(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Mean token loss of one batch."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(self.autocast())
            return self.model(x, y).item()

    def full_state_dict(self) -> dict:
        """The whole model on rank 0 (every rank holds all of it)."""
        return exatrain.full_state_dict(self.model)
