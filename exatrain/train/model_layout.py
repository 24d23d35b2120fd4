"""The model of a layout, defined once: training builds it this way and `exatrain plan` measures it this way.

A plan is only right while it applies the layout exactly as training does, so both call these.
"""

from __future__ import annotations

import torch

import exatrain
from exatrain.config import Config, ParallelConfig
from exatrain.models import configured_shape
from exatrain.models.tp_plan import tp_plan
from exatrain.models.transformer import TransformerLM

PARAM_DTYPES = {"fp32": None, "bf16": torch.bfloat16}  # parallel.param_dtype -> FSDP's param_dtype


def lm_from_config(cfg: Config, vocab_size: int) -> TransformerLM:
    """The language model the config describes (on the current default device: meta when building a
    layout)."""
    return TransformerLM(configured_shape(cfg.model), vocab_size, cfg.data.seq_len, cfg.model.dropout)


def apply_layout(model: torch.nn.Module, ctx, p: ParallelConfig, layout: str = "auto") -> torch.nn.Module:
    """Parallelise the LM or one pipeline stage's chunk of it (its blocks in `.layers`) for the layout of
    `ctx` (exatrain.init's Context: its dims, mesh and device) with exatrain.parallelize and the model's own
    tensor-parallel plan: TP -> AC -> compile -> FSDP, or replication (DDP; TP replicas' gradient sync;
    FSDP2's replicate for pipeline stages). Returns what parallelize returns (the DDP wrapper for DDP).
    A chunk on the meta device stays there (exatrain.load_full_state_dict fills it). `layout`:
    parallelize's."""
    plan = tp_plan(model.layers.keys(), p.sequence_parallel, p.loss_parallel) if ctx.dims.tp_enabled else None
    ac = {"none": False, "full": "full", "every": p.activation_checkpoint_every}[p.activation_checkpoint]
    return exatrain.parallelize(
        model,
        ctx,
        layout=layout,
        blocks="layers",
        activation_checkpoint=ac,
        compile=p.compile,
        compile_backend=p.compile_backend,
        param_dtype=PARAM_DTYPES[p.param_dtype],
        cpu_offload=p.cpu_offload,
        tp_plan=plan,
        reshard_after_forward=p.fsdp_reshard_after_forward,
    )
