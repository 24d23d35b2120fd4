"""Build this rank's model for the layout and the engine that runs it.

Without pipeline parallel, through the public API: the weights a single-process run starts from (a
seeded plain model, or `checkpoint.init_from`) go through `exatrain.parallelize` with the model's blocks
and tensor-parallel plan (TP -> AC -> compile -> FSDP / DDP). With pipeline parallel (not part of the
public API), each rank builds its stages on the meta device and fills them from the same weights
(train/pipeline_engine.py). So every layout starts from bit-identical weights, which makes layouts
comparable step by step.
"""

from __future__ import annotations

import torch

import exatrain
from exatrain.checkpoint import load_model_file
from exatrain.config import Config
from exatrain.distributed import seed_everything
from exatrain.distributed.parallelize import DTYPES
from exatrain.models.tp_plan import tp_plan
from exatrain.models.transformer import TransformerLM
from exatrain.train.engine import DataParallelEngine
from exatrain.train.model_layout import lm_from_config
from exatrain.train.pipeline_engine import build_pipeline_engine


def reference_model(cfg: Config, vocab_size: int) -> TransformerLM:
    """The plain CPU model a single-process run starts from: seeded init, or the init_from file."""
    seed_everything(cfg.train.seed)
    model = lm_from_config(cfg, vocab_size)
    if cfg.checkpoint.init_from:
        load_model_file(model, cfg.checkpoint.init_from)
    return model


def build_data_parallel_model(cfg: Config, ctx, model: TransformerLM) -> torch.nn.Module:
    """`model` parallelised for the layout of `ctx` (no pipeline parallel) with exatrain.parallelize: the
    DDP wrapper for pure replication, else the (TP/FSDP-parallelised) model itself.

    Replicas of a tensor-parallel model are not wrapped (torch's DDP takes no DTensors): the engine
    all-reduces their gradients after backward."""
    p, dims = cfg.parallel, ctx.dims
    plan = tp_plan(model.layers.keys(), p.sequence_parallel, p.loss_parallel) if dims.tp_enabled else None
    ac = {"none": False, "full": "full", "every": p.activation_checkpoint_every}[p.activation_checkpoint]
    return exatrain.parallelize(
        model, ctx, layout="none" if dims.ddp and dims.tp_enabled else "auto", blocks="layers",
        activation_checkpoint=ac, compile=p.compile, compile_backend=p.compile_backend,
        param_dtype=DTYPES[p.param_dtype], cpu_offload=p.cpu_offload, tp_plan=plan,
        reshard_after_forward=p.fsdp_reshard_after_forward)


def uses_bf16(precision: str, device: torch.device) -> bool:
    """train.precision: auto is bf16 on GPUs and fp32 on CPUs."""
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")


def build_engine(cfg: Config, dims, ctx, vocab_size: int, autocast):
    """The engine for this layout, with its model(s) built and initialised."""
    reference = reference_model(cfg, vocab_size)
    if cfg.engine.name == "deepspeed":
        from exatrain.train.deepspeed_engine import DeepSpeedEngine  # imports deepspeed: only when asked for

        return DeepSpeedEngine(cfg, dims, ctx, reference, bf16=uses_bf16(cfg.train.precision, ctx.device))
    if cfg.engine.name == "horovod":
        from exatrain.train.horovod_engine import HorovodEngine  # imports horovod: only when asked for

        accumulation = cfg.train.global_batch_size // (cfg.train.micro_batch_size * dims.dp)
        return HorovodEngine(cfg, ctx, reference, accumulation, autocast)
    num_params = reference.num_params()
    if dims.pp_enabled:
        return build_pipeline_engine(cfg, dims, ctx.device, vocab_size, reference.state_dict(), num_params, autocast)
    model = build_data_parallel_model(cfg, ctx, reference)
    return DataParallelEngine(model, dims, ctx.device, num_params, dims.tp_enabled and cfg.parallel.loss_parallel,
                              autocast)
