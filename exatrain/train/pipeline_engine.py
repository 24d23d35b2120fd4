"""PipelineEngine: the engine (see train/data_parallel_engine.py) for layouts with pipeline parallelism
(parallel.pp > 1).

Each rank builds the model on the meta device, keeps only its pipeline stages (models.pipeline_split;
looped assignment, several stages per rank for interleaved 1F1B), applies the layout's other dimensions
to each stage chunk with `exatrain.parallelize` as without pipelining (TP on 'tp', AC, compile, FSDP on
'fsdp'; pure replication with FSDP2's `replicate` on 'dp'), materialises it from the seeded reference
weights (`exatrain.load_full_state_dict`), and hands the chunks to an `exatrain.Pipeline` (a
torch.distributed.pipelining schedule) on the 'pp' mesh.

The rank's model part is ONE module holding all its stages under the full model's parameter names: the
optimizer, DCP checkpoints and weight digests use it like an unsplit model; `full_state_dict` gathers
all stages (and their FSDP/TP shards) into a plain state dict on rank 0.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

import exatrain
from exatrain.config import Config
from exatrain.engines.protocol import Engine
from exatrain.models.pipeline_split import split_for_stages
from exatrain.models.transformer import lm_loss
from exatrain.train.model_layout import apply_layout, lm_from_config


class PipelineEngine(Engine):
    """This rank's pipeline stages and the schedule that runs them (interface of DataParallelEngine)."""

    def __init__(
        self,
        rank_model: torch.nn.Module,
        pipeline: exatrain.Pipeline,
        num_params: int,
        use_loss_parallel: bool,
        autocast: Callable[[], contextlib.AbstractContextManager],
    ):
        super().__init__([rank_model], num_params, use_loss_parallel, autocast)
        self.pipeline = pipeline

    def train_step(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Forward and backward of all micro-batches through the pipeline; returns their mean loss,
        the same on every stage (broadcast from the last one, so metric averaging over dp works)."""
        with self._context():
            return self.pipeline.forward_backward(micro_batches)

    @torch.no_grad()
    def eval_loss(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Mean token loss of one batch through all stages (forward only); every stage gets it."""
        with self._context():
            return self.pipeline.eval_loss(x, y).item()

    def full_state_dict(self) -> dict:
        """The whole model, unsharded, on rank 0 ({} elsewhere); a collective over all ranks."""
        return self.pipeline.full_state_dict(self.model_parts[0])


def build_pipeline_engine(
    cfg: Config, ctx, vocab_size: int, full_state: dict, num_params: int, autocast
) -> PipelineEngine:
    """Build this rank's stages for the layout of `ctx` (exatrain.init's Context), loaded with
    `full_state`."""
    p, dims, device = cfg.parallel, ctx.dims, ctx.device
    with torch.device("meta"):
        model = lm_from_config(cfg, vocab_size)
    n_stages = dims.pp * p.pp_stages_per_rank
    ids = exatrain.Pipeline.stage_ids(dims.coordinate("pp"), dims.pp, p.pp_stages_per_rank)
    rank_model, chunks = split_for_stages(model, ids, n_stages)
    for chunk in chunks:
        apply_layout(chunk, ctx, p)
        exatrain.load_full_state_dict(chunk, full_state, device)
    pipeline = exatrain.Pipeline(
        chunks,
        ids,
        n_stages,
        dims.mesh("pp").get_group(),
        device,
        p.pp_schedule,
        dims.microbatches(p),
        lm_loss,
    )
    return PipelineEngine(rank_model, pipeline, num_params, dims.tp_enabled and p.loss_parallel, autocast)
