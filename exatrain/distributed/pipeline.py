"""Pipeline parallelism over torch.distributed.pipelining, model-agnostic.

The caller splits its model into stage chunks (for the reference LM: models.pipeline_split) and passes
them in with a loss function; this module builds one PipelineStage per chunk on the pipeline process
group, picks the schedule by name, runs training and evaluation steps, and reports the loss of the last
stage to every rank of the pipeline.

Stage assignment is torch's 'looped' one: with pp ranks and k stages per rank, pipeline rank r owns
stages r, r + pp, ..., r + (k-1)*pp (k = 1 for GPipe and 1F1B; k >= 2 for interleaved 1F1B).

Loss and gradient scaling: the schedules run the loss function once per pipeline microbatch and
backpropagate each result as is (`scale_grads=False`; torch's own scaling would divide all gradients,
including ones accumulated by earlier steps of the same optimizer step). So the loss function returns
the microbatch's mean loss divided by (microbatches x accumulation steps): the gradients summed over
all microbatches of all accumulation steps are then those of the mean loss over this rank's batch,
as in the single-process reference; data-parallel reduction (FSDP's reduce-scatter, an average)
then yields the mean over the global batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from exatrain.distributed.parallelize import gathered_state_dict, local_tensor

# torch.distributed.pipelining is imported where a Pipeline is built: it pulls in torch._dynamo and
# torch.export (about 0.8 s per worker process), which runs without pipeline parallel never need
SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved_1f1b": "ScheduleInterleaved1F1B"}
MULTI_STAGE = ("interleaved_1f1b",)  # schedules that take a list of stages (several per rank)


def stage_ids(pp_rank: int, pp: int, stages_per_rank: int) -> list[int]:
    """Stages owned by pipeline rank `pp_rank` (looped assignment: r, r + pp, r + 2 pp, ...)."""
    return [pp_rank + k * pp for k in range(stages_per_rank)]


class ScaledLoss:
    """The last stage's loss function: `loss_fn(output, target) * scale`, scale set per step (see the
    module docstring for why)."""

    def __init__(self, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        self.loss_fn, self.scale = loss_fn, 1.0

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(output, target) * self.scale


class Pipeline:
    """`exatrain.Pipeline`: this rank's stages of a pipeline-parallel model and the
    torch.distributed.pipelining schedule that drives them (pipeline parallel for any model split into stage
    modules).

    `chunks[i]` is the module of stage `ids[i]` (`Pipeline.stage_ids(pp_rank, pp, per_rank)`) of `n_stages`;
    the first stage takes the batch input, the last one returns what `loss_fn(output, target)` turns into a
    scalar mean loss. `group`: the pipeline ranks (`ctx.dims.mesh("pp").get_group()`), `schedule`: "gpipe",
    "1f1b" or "interleaved_1f1b" (several stages per rank), `microbatches`: pipeline microbatches per batch.
    `forward_backward(batches)` accumulates gradients in the chunks and returns the mean loss on every
    pipeline rank; `eval_loss(x, y)`; `full_state_dict(module)` gathers all stages on rank 0."""

    def __init__(
        self,
        chunks: list[nn.Module],
        ids: list[int],
        n_stages: int,
        group: dist.ProcessGroup,
        device: torch.device,
        schedule: str,
        microbatches: int,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ):
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown pipeline schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
        from torch.distributed import pipelining

        self.group, self.microbatches = group, microbatches
        self.stages = [
            pipelining.PipelineStage(c, i, n_stages, device, group=group) for c, i in zip(chunks, ids)
        ]
        self.has_last = (n_stages - 1) in ids
        # the group rank that holds the last stage (looped assignment): where losses come from
        self.last_rank = (n_stages - 1) % dist.get_world_size(group)
        self.loss = ScaledLoss(loss_fn)
        stages = self.stages if schedule in MULTI_STAGE else self.stages[0]
        self.schedule = getattr(pipelining, SCHEDULES[schedule])(
            stages, microbatches, loss_fn=self.loss, scale_grads=False
        )

    #: stages of pipeline rank r (looped assignment): `Pipeline.stage_ids(r, pp, stages_per_rank)`
    stage_ids = staticmethod(stage_ids)

    def full_state_dict(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's state dict on global rank 0 ({} elsewhere) from this rank's stages (`module`
        holds them under the whole model's names); a collective over all ranks."""
        return gather_full_state_dict(module, self.group) or {}

    def forward_backward(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Forward and backward over this rank's micro-batches (gradients accumulate in the chunks'
        parameters); returns the mean loss over them, the same on every pipeline rank."""
        self.loss.scale = 1.0 / (self.microbatches * len(batches))
        total = torch.zeros((), device=self.stages[0].device)
        for x, y in batches:
            losses: list[torch.Tensor] = []
            self.schedule.step(x, target=y, losses=losses, return_outputs=False)
            if self.has_last:
                total += _sum_local(losses).detach()
        return self._from_last(total)

    @torch.no_grad()
    def eval_loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean loss over one batch, forward only; the same on every pipeline rank. (Dropout: the
        caller switches the chunks to eval mode.)"""
        self.loss.scale = 1.0 / self.microbatches  # microbatches are equal-sized: mean of means
        losses: list[torch.Tensor] = []
        self.schedule.eval(x, target=y, losses=losses)
        total = _sum_local(losses) if self.has_last else torch.zeros((), device=self.stages[0].device)
        return self._from_last(total)

    def _from_last(self, value: torch.Tensor) -> torch.Tensor:
        """Broadcast a scalar from the rank holding the last stage to the whole pipeline group."""
        value = value.detach().float().clone()
        dist.broadcast(value, group=self.group, group_src=self.last_rank)
        return value


def _sum_local(losses: list[torch.Tensor]) -> torch.Tensor:
    """Sum of microbatch losses as a plain tensor (under loss parallel they are replicated DTensors)."""
    return torch.stack([local_tensor(t) for t in losses]).sum()


def apply_replicate(module: nn.Module, dp_mesh) -> None:
    """Data-parallel replication of one stage chunk (pure DDP layouts under pipelining).

    DDP itself does not work here: a schedule runs several microbatch forwards before their backwards,
    which breaks DDP's bucket rebuilding (a reducer assertion in torch 2.13). FSDP2's `replicate` keeps
    full parameters on every rank, all-reduces gradients, and the pipeline stage drives its gradient
    sync like FSDP's (once, after the last microbatch's backward)."""
    from torch.distributed._composable.replicate_with_fsdp import replicate

    replicate(module, mesh=dp_mesh)


def gather_full_state_dict(
    module: nn.Module, pp_group: dist.ProcessGroup | None
) -> dict[str, torch.Tensor] | None:
    """The full model's state dict on global rank 0 (None elsewhere), from this rank's `module` (its
    stages' parameters under full-model names, possibly FSDP-sharded / TP DTensors).

    Collective over all ranks: each stage's DTensors are gathered within its own data/tensor-parallel
    group, then the pipeline group that contains global rank 0 sends the per-stage dicts to it."""
    full = gathered_state_dict(module)  # on every rank of the stage: the pipeline gather below needs them
    if pp_group is None:
        return full if dist.get_rank() == 0 else None
    if 0 not in dist.get_process_group_ranks(pp_group):
        return None
    parts = [None] * dist.get_world_size(pp_group) if dist.get_rank() == 0 else None
    dist.gather_object(full, parts, group=pp_group, group_dst=0)
    if parts is None:
        return None
    return {k: v for part in parts for k, v in part.items()}
