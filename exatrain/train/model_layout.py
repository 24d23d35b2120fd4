"""The model of a layout, defined once: training builds it this way and `exatrain plan` measures it this way.

A plan is only right while it applies the layout exactly as training does, so both call these.
"""

from __future__ import annotations

import torch

from exatrain.config import Config, ParallelConfig
from exatrain.distributed.parallelize import parallelize
from exatrain.distributed.pipeline import apply_replicate
from exatrain.models import configured_shape
from exatrain.models.tp_plan import tp_plan
from exatrain.models.transformer import TransformerLM


def lm_from_config(cfg: Config, vocab_size: int) -> TransformerLM:
    """The language model the config describes (on the current default device: meta when building a layout)."""
    return TransformerLM(configured_shape(cfg.model), vocab_size, cfg.data.seq_len, cfg.model.dropout)


def apply_layout(chunk: torch.nn.Module, dims, p: ParallelConfig, device_type: str) -> None:
    """Parallelise a model or pipeline stage chunk for the layout `dims` (mesh built): TP -> AC -> compile ->
    FSDP (exatrain.distributed.parallelize), and FSDP2's replicate for pure replication under pipeline parallel."""
    plan = tp_plan(chunk.layers.keys(), p.sequence_parallel, p.loss_parallel) if dims.tp_enabled else None
    parallelize(chunk, chunk.layers, dims, p, plan, device_type)
    if dims.pp_enabled and dims.ddp:
        apply_replicate(chunk, dims.mesh("dp"))
