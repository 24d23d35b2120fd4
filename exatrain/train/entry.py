"""Entry point of one rank: detect the cluster, join the group, load data, train, leave cleanly."""

from __future__ import annotations

import exatrain
from exatrain.config import Config
from exatrain.env import detect_environment
from exatrain.train.data_setup import prepare_data
from exatrain.train.preflight import preflight
from exatrain.train.trainer import Trainer


def run_training(cfg: Config, environ=None) -> dict:
    """Train on this rank as part of whatever job it belongs to; returns the run summary.

    Set up through the public API (exatrain.init), after the configuration was checked against the
    world size (a layout that cannot work fails before any process group is joined)."""
    preflight(cfg, detect_environment(environ, **cfg.dist.env_options()).world_size)
    with exatrain.init(
        device=cfg.train.device,
        seed=cfg.train.seed,
        summary=False,
        environ=environ,
        parallel=cfg.parallel,
        dist=cfg.dist,
        job=cfg.job,
    ) as ctx:
        return Trainer(cfg, ctx, prepare_data(cfg)).fit()
