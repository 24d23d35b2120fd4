"""Build this rank's model for the layout and the engine that runs it.

Through the public API only. Without pipeline parallel: the weights a single-process run starts from (a
seeded plain model, or `checkpoint.init_from`) go through `exatrain.parallelize` with the model's blocks
and tensor-parallel plan (TP -> AC -> compile -> FSDP / DDP). With pipeline parallel, each rank builds its
stages on the meta device, parallelises them the same way and fills them from the same weights with
`exatrain.load_full_state_dict` (train/pipeline_engine.py). So every layout starts from bit-identical
weights, which makes layouts comparable step by step.
"""

from __future__ import annotations

import torch

import exatrain
from exatrain.config import Config
from exatrain.models.transformer import TransformerLM
from exatrain.train.data_parallel_engine import DataParallelEngine
from exatrain.train.model_layout import apply_layout, lm_from_config
from exatrain.train.pipeline_engine import build_pipeline_engine


def reference_model(cfg: Config, vocab_size: int) -> TransformerLM:
    """The plain CPU model a single-process run starts from: seeded init, or the init_from file."""
    exatrain.seed_everything(cfg.train.seed)
    model = lm_from_config(cfg, vocab_size)
    if cfg.checkpoint.init_from:
        exatrain.load_model_file(model, cfg.checkpoint.init_from)
    return model


def uses_bf16(precision: str, device: torch.device) -> bool:
    """train.precision: auto is bf16 on GPUs and fp32 on CPUs."""
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")


def build_engine(cfg: Config, dims, ctx, vocab_size: int, autocast):
    """The engine for this layout, with its model(s) built and initialised."""
    reference = reference_model(cfg, vocab_size)
    if cfg.engine.name == "deepspeed":
        from exatrain.engines.deepspeed.engine import (
            DeepSpeedEngine,  # imports deepspeed: only when asked for
        )

        return DeepSpeedEngine(cfg, dims, ctx, reference, bf16=uses_bf16(cfg.train.precision, ctx.device))
    if cfg.engine.name == "horovod":
        from exatrain.engines.horovod.engine import HorovodEngine  # imports horovod: only when asked for

        accumulation = cfg.train.global_batch_size // (cfg.train.micro_batch_size * dims.dp)
        return HorovodEngine(cfg, ctx, reference, accumulation, autocast)
    num_params = reference.num_params()
    if dims.pp_enabled:
        return build_pipeline_engine(cfg, ctx, vocab_size, reference.state_dict(), num_params, autocast)
    model = apply_layout(reference, ctx, cfg.parallel)  # the DDP wrapper for pure replication
    return DataParallelEngine(
        model, ctx.device, num_params, dims.tp_enabled and cfg.parallel.loss_parallel, autocast
    )
