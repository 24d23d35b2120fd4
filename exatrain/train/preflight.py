"""Checks a configuration against a world size before any process is started or group is joined."""

from __future__ import annotations

import time

import exatrain
from exatrain.config import Config
from exatrain.config.validate import check_choice, check_hang_timeout
from exatrain.engines.deepspeed.config import deepspeed_config
from exatrain.env.affinity import MODES as AFFINITY_MODES
from exatrain.env.watch import job_end_time
from exatrain.errors import ConfigError
from exatrain.models import configured_shape

_SPLITS = ("train", "valid", "test")


def preflight(cfg: Config, world_size: int) -> exatrain.ParallelDims:
    """Raise ConfigError (with a HINT) for settings that cannot work with `world_size` ranks; returns
    the checked parallel layout."""
    shape = configured_shape(cfg.model)
    dims = exatrain.ParallelDims.from_config(cfg.parallel, world_size)
    t, d = cfg.train, cfg.data
    _positive("train.steps", t.steps)
    _positive("train.global_batch_size", t.global_batch_size)
    _positive("train.micro_batch_size", t.micro_batch_size)
    _positive("data.seq_len", d.seq_len)
    _positive("train.log_every", t.log_every)
    per_step = t.micro_batch_size * dims.dp
    if t.global_batch_size % per_step:
        raise ConfigError(
            f"batch size not divisible as configured: train.global_batch_size={t.global_batch_size} is not a "
            f"multiple of train.micro_batch_size={t.micro_batch_size} x {dims.dp} data-parallel "
            f"rank(s) = {per_step}",
            f"pick a global batch that is a multiple of {per_step} (e.g. "
            f"--train.global_batch_size={per_step * max(1, t.global_batch_size // per_step)}) "
            "or change the micro batch",
        )
    check_choice("train.precision", t.precision, ("auto", "bf16", "fp32"))
    check_choice("train.device", t.device, ("auto", "cuda", "cpu"))
    check_choice("dist.backend", cfg.dist.backend, ("auto", "nccl", "gloo"))
    check_choice("dist.affinity", cfg.dist.affinity, AFFINITY_MODES)
    check_choice("data.kind", d.kind, ("synthetic", "wikitext", "text"))
    _check_hang_timeout(cfg.run.hang_timeout_s)
    _positive("observe.straggler_intervals", cfg.observe.straggler_intervals)
    if not cfg.observe.straggler_ratio > 1.0:
        raise ConfigError(
            "observe.straggler_ratio must be above 1 (a step time ratio), got "
            f"{cfg.observe.straggler_ratio:g}",
            "use e.g. --observe.straggler_ratio=1.2 (a rank that makes every step 20 % longer)",
        )
    check_choice("data.train_split", d.train_split, _SPLITS)
    check_choice("data.eval_split", d.eval_split, _SPLITS)
    if not 0.0 <= cfg.model.dropout < 1.0:
        raise ConfigError(
            f"model.dropout must be in [0, 1), got {cfg.model.dropout}", "use e.g. --model.dropout=0.1"
        )
    dims.check(cfg.parallel, shape, t.micro_batch_size)
    _check_engine(cfg, dims)
    if dims.tp_enabled and cfg.parallel.sequence_parallel and d.seq_len % dims.tp:
        raise ConfigError(
            f"parallel.sequence_parallel splits each window along the sequence, but data.seq_len="
            f"{d.seq_len} is not divisible by parallel.tp={dims.tp}",
            f"use a data.seq_len that is a multiple of {dims.tp}, e.g. "
            f"--data.seq_len={dims.tp * max(1, d.seq_len // dims.tp)}",
        )
    return dims


ENGINES = ("torch", "deepspeed", "horovod")


def _check_engine(cfg: Config, dims: exatrain.ParallelDims) -> None:
    """engine.name, and for DeepSpeed its layout and DeepSpeed JSON (a user's file is read and checked
    now)."""
    check_choice("engine.name", cfg.engine.name, ENGINES)
    if cfg.engine.name == "torch":
        return
    if dims.tp_enabled or dims.pp_enabled or dims.dp_shard > 1:
        raise ConfigError(
            f"engine.name={cfg.engine.name} shards by itself, but [parallel] asks for {dims.describe()}",
            "drop parallel.tp / parallel.pp / parallel.dp_shard (ZeRO's stage is engine.zero_stage)",
        )
    if cfg.engine.name == "deepspeed":
        bf16 = True if cfg.train.precision == "bf16" else False if cfg.train.precision == "fp32" else None
        deepspeed_config(cfg, dims.dp, bf16)


def _positive(key: str, value: int) -> None:
    if value <= 0:
        raise ConfigError(f"{key} must be positive, got {value}", f"set --{key} to a value of at least 1")


def _check_hang_timeout(timeout_s: float) -> None:
    """run.hang_timeout_s: 0 (off), -1 (derived from the steps), or seconds of at least 2 and, inside a SLURM
    job whose end time is known, below the time left (else a hang would burn the rest undetected)."""
    if timeout_s in (0, -1):
        return
    if timeout_s < 0:
        raise ConfigError(
            f"run.hang_timeout_s = {timeout_s:g}: negative, but not -1 (derived from the steps)",
            "use -1 for a timeout derived from the first steps, 0 for none, or seconds (e.g. 300)",
        )
    end = job_end_time()
    left = None if end is None else end - time.time()
    check_hang_timeout(timeout_s, "run.hang_timeout_s", left, "the time left of this SLURM job")
