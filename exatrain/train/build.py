"""Build this rank's model for the layout and the engine that runs it.

The model is created on the meta device (no memory), parallelised (TP -> AC -> compile -> FSDP, see
`exatrain.distributed.parallelize`), materialised on the rank's device, and filled from the weights a
single-process run would start from (a seeded plain model, or `checkpoint.init_from`). So every layout
starts from bit-identical weights, which makes layouts comparable step by step.
"""

from __future__ import annotations

import torch

from exatrain.checkpoint import load_model_file
from exatrain.config import Config
from exatrain.distributed import DistContext, seed_everything
from exatrain.distributed.parallelize import load_full_state_dict
from exatrain.models.transformer import TransformerLM
from exatrain.train.engine import DataParallelEngine
from exatrain.train.model_layout import apply_layout, lm_from_config
from exatrain.train.pipeline_engine import build_pipeline_engine


def reference_model(cfg: Config, vocab_size: int) -> TransformerLM:
    """The plain CPU model a single-process run starts from: seeded init, or the init_from file."""
    seed_everything(cfg.train.seed)
    model = lm_from_config(cfg, vocab_size)
    if cfg.checkpoint.init_from:
        load_model_file(model, cfg.checkpoint.init_from)
    return model


def build_data_parallel_model(cfg: Config, dims, device: torch.device, vocab_size: int,
                              full_state: dict) -> TransformerLM:
    """The whole model for a layout without pipeline parallel, parallelised and loaded with `full_state`."""
    with torch.device("meta"):
        model = lm_from_config(cfg, vocab_size)
    apply_layout(model, dims, cfg.parallel, device.type)
    # with CPU offload FSDP keeps the sharded parameters in CPU memory and copies them to the device per use
    load_full_state_dict(model, torch.device("cpu") if cfg.parallel.cpu_offload else device, full_state)
    return model


def uses_bf16(precision: str, device: torch.device) -> bool:
    """train.precision: auto is bf16 on GPUs and fp32 on CPUs."""
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")


def build_engine(cfg: Config, dims, ctx: DistContext, vocab_size: int, autocast):
    """The engine for this layout, with its model(s) built and initialised."""
    reference = reference_model(cfg, vocab_size)
    if cfg.engine.name == "deepspeed":
        from exatrain.train.deepspeed_engine import DeepSpeedEngine  # imports deepspeed: only when asked for

        return DeepSpeedEngine(cfg, dims, ctx, reference, bf16=uses_bf16(cfg.train.precision, ctx.device))
    if cfg.engine.name == "horovod":
        from exatrain.train.horovod_engine import HorovodEngine  # imports horovod: only when asked for

        accumulation = cfg.train.global_batch_size // (cfg.train.micro_batch_size * dims.dp)
        return HorovodEngine(cfg, ctx, reference, accumulation, autocast)
    full_state, num_params = reference.state_dict(), reference.num_params()
    if dims.pp_enabled:
        return build_pipeline_engine(cfg, dims, ctx.device, vocab_size, full_state, num_params, autocast)
    model = build_data_parallel_model(cfg, dims, ctx.device, vocab_size, full_state)
    return DataParallelEngine(model, dims, ctx.device, num_params, dims.tp_enabled and cfg.parallel.loss_parallel,
                              autocast)
