"""PipelineEngine: the engine (see train/engine.py) for layouts with pipeline parallelism (parallel.pp > 1).

Each rank builds the model on the meta device, keeps only its pipeline stages (models.pipeline_split;
looped assignment, several stages per rank for interleaved 1F1B), applies the layout's other dimensions
to each stage chunk with the same ordered `parallelize` as without pipelining (TP on 'tp', AC, compile,
FSDP on 'fsdp'; pure replication with FSDP2's `replicate` on 'dp'), materialises it from the seeded
reference weights, and hands the chunks to a schedule on the 'pp' mesh (dist.pipeline).

The rank's model part is ONE module holding all its stages under the full model's parameter names: the
optimizer, DCP checkpoints and weight digests use it like an unsplit model; `full_state_dict` gathers
all stages (and their FSDP/TP shards) into a plain state dict on rank 0.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from exatrain.config import Config
from exatrain.dist.parallelize import load_full_state_dict, parallelize
from exatrain.dist.pipeline import Pipeline, apply_replicate, gather_full_state_dict, stage_ids
from exatrain.models.pipeline_split import split_for_stages
from exatrain.models.tp_plan import tp_plan
from exatrain.models.transformer import build_model, lm_loss
from exatrain.train.engine import Engine


class PipelineEngine(Engine):
    """This rank's pipeline stages and the schedule that runs them (interface of DataParallelEngine)."""

    def __init__(self, rank_model: torch.nn.Module, pipeline: Pipeline, pp_group, num_params: int,
                 use_loss_parallel: bool, autocast: Callable[[], contextlib.AbstractContextManager]):
        super().__init__([rank_model], num_params, use_loss_parallel, autocast)
        self.pipeline, self.pp_group = pipeline, pp_group

    def _context(self) -> contextlib.ExitStack:
        """Autocast and loss parallel around a whole schedule step: the schedule runs forward, loss and
        backward inside one call, and loss parallel's cross-entropy needs its context in both."""
        stack = contextlib.ExitStack()
        stack.enter_context(self._loss_context())
        stack.enter_context(self.autocast())
        return stack

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
        return gather_full_state_dict(self.model_parts[0], self.pp_group) or {}


def build_pipeline_engine(cfg: Config, dims, device: torch.device, vocab_size: int, full_state: dict,
                          num_params: int, autocast) -> PipelineEngine:
    """Build this rank's stages for the layout `dims` (mesh built), loaded with `full_state`."""
    p = cfg.parallel
    with torch.device("meta"):
        model = build_model(cfg.model.size, vocab_size, cfg.data.seq_len, cfg.model.dropout, cfg.model.n_layers)
    n_stages = dims.pp * p.pp_stages_per_rank
    ids = stage_ids(dims.coordinate("pp"), dims.pp, p.pp_stages_per_rank)
    rank_model, chunks = split_for_stages(model, ids, n_stages)
    for chunk in chunks:
        plan = tp_plan(chunk.layers.keys(), p.sequence_parallel, p.loss_parallel) if dims.tp_enabled else None
        parallelize(chunk, chunk.layers, dims, p, plan, device.type)
        if dims.ddp:
            apply_replicate(chunk, dims.mesh("dp"))
        load_full_state_dict(chunk, device, full_state)
    pp_group = dims.mesh("pp").get_group()
    pipeline = Pipeline(chunks, ids, n_stages, pp_group, device, p.pp_schedule, dims.microbatches(p), lm_loss)
    return PipelineEngine(rank_model, pipeline, pp_group, num_params, dims.tp_enabled and p.loss_parallel, autocast)
