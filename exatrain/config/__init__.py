"""Typed configuration and its one loader (TOML file + `--section.key=value` overrides)."""

from exatrain.config.load import load_config, parse_override, read_toml, reference, to_toml
from exatrain.config.schema import (
    CheckpointConfig,
    Config,
    DataConfig,
    DistConfig,
    EngineConfig,
    JobConfig,
    ModelConfig,
    ParallelConfig,
    RunConfig,
    TrainConfig,
)

__all__ = [
    "CheckpointConfig",
    "Config",
    "DataConfig",
    "DistConfig",
    "EngineConfig",
    "JobConfig",
    "ModelConfig",
    "ParallelConfig",
    "RunConfig",
    "TrainConfig",
    "load_config",
    "parse_override",
    "read_toml",
    "reference",
    "to_toml",
]
