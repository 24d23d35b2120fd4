"""`[engine] name = "deepspeed"`: the reference model trained by DeepSpeed ZeRO (stage 1, 2 or 3).

exatrain still decides everything it decides for its torch engine: the process group (DeepSpeed wraps it,
exatrain.attach_deepspeed), the model's initial weights, AdamW and its schedule, batch sizes,
accumulation, clipping and precision (a DeepSpeed JSON config generated from [train],
engines/deepspeed/config.py). DeepSpeed runs the step: backward with its gradient partitioning, clipping, the
optimizer and the schedule at the accumulation boundary. Checkpoints go through DeepSpeed's own save/load:
exatrain.Checkpointer given the DeepSpeed engine (`self.ds`) writes them in exatrain's run layout
(engines/deepspeed/checkpoints.py).

Same role as engines/horovod/engine.py: each engine package has its engine.py.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

import exatrain
from exatrain.config import Config
from exatrain.engines.deepspeed.config import deepspeed_config
from exatrain.engines.optim import build_optimizer, build_scheduler
from exatrain.engines.protocol import Engine
from exatrain.observe import backward_wait


class DeepSpeedEngine(Engine):
    """One model per rank inside a DeepSpeed engine; `train_step` also steps the optimizer and schedule."""

    steps_optimizer = True  # the trainer neither clips nor steps: DeepSpeed does both

    def __init__(self, cfg: Config, dims, ctx: exatrain.Context, reference: torch.nn.Module, bf16: bool):
        deepspeed = exatrain.attach_deepspeed(ctx, cfg.dist.timeout_s)  # a group of one for a single process
        model = reference.to(ctx.device)
        optimizer = build_optimizer(model, cfg.train)
        scheduler = build_scheduler(optimizer, cfg.train)
        self.config = deepspeed_config(cfg, dims.dp, bf16)
        self.zero_stage = self.config["zero_optimization"]["stage"]
        self.ds, _, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=self.config
        )
        # DeepSpeed keeps the torch optimizer and schedule it was given: the trainer reads LR from these
        self.optimizer, self.scheduler = optimizer, scheduler
        self.grad_norm: torch.Tensor | None = None
        self._deepspeed = deepspeed
        # what DeepSpeed runs on (DS_ACCELERATOR, set by
        # import_deepspeed where there is no GPU): the banner says it
        self.accelerator = deepspeed.get_accelerator().device_name()
        super().__init__([self.ds.module], reference.num_params(), False, contextlib.nullcontext)

    def train_step(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Forward, backward and DeepSpeed's step per micro-batch; the optimizer steps after the last one."""
        total = torch.zeros((), device=micro_batches[0][0].device)
        for x, y in micro_batches:
            loss = self.ds(x, y)
            with backward_wait.timed(loss):  # its wait for the others: the straggler accounting's
                self.ds.backward(loss)  # DeepSpeed divides by the accumulation steps
            self.ds.step()
            total += loss.detach().float() / len(micro_batches)
        norm = self.ds.get_global_grad_norm()  # before clipping, of the whole model
        self.grad_norm = None if norm is None else torch.as_tensor(float(norm))
        return total

    @torch.no_grad()
    def eval_loss(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Mean token loss of one batch (ZeRO-3 gathers parameters in the forward as in training)."""
        return self.ds(x, y).float().item()

    def checkpoint_model(self):
        """DeepSpeed's engine: the Checkpointer uses DeepSpeed's own save/load (deepspeed/checkpoints.py)."""
        return self.ds

    def train(self, mode: bool = True) -> None:
        """Dropout on (train) or off (eval)."""
        self.ds.train(mode)

    def full_state_dict(self) -> dict:
        """The whole model in fp32 on rank 0 ({} elsewhere); a collective (ZeRO-3 gathers its shards)."""
        module = self.ds.module
        gathered = (
            self._deepspeed.zero.GatheredParameters(list(module.parameters()))
            if self.zero_stage == 3
            else contextlib.nullcontext()
        )
        root = not dist.is_initialized() or dist.get_rank() == 0
        with gathered:
            if not root:
                return {}
            return {k: v.detach().float().cpu().clone() for k, v in module.state_dict().items()}
