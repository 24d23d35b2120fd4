"""Entry point of one rank: detect the cluster, join the group, load data, train, leave cleanly."""

from __future__ import annotations

from pathlib import Path

from exatrain.config import Config
from exatrain.data import Corpus, load_corpus
from exatrain.distributed import init_distributed, teardown
from exatrain.env import detect_environment
from exatrain.distributed.affinity import check_affinity
from exatrain.train.preflight import preflight
from exatrain.train.trainer import Trainer


def cache_dir(cfg: Config) -> str:
    """Where tokenised data is cached: data.cache_dir, else a .cache folder beside the run directory."""
    return cfg.data.cache_dir or str(Path(cfg.run.dir).resolve().parent / ".cache" / "data")


def prepare_data(cfg: Config) -> Corpus:
    """Load (and on first use tokenise and cache) the configured corpus."""
    d = cfg.data
    options = {
        "synthetic": {"seed": d.seed},
        "wikitext": {"train_from": d.train_split},  # the vocabulary comes from the file trained on
        "text": {"max_vocab": d.max_vocab or None},
    }.get(d.kind, {})
    return load_corpus(d.kind, d.path or None, cache_dir(cfg), **options)


def run_training(cfg: Config, environ=None) -> dict:
    """Train on this rank as part of whatever job it belongs to; returns the run summary."""
    env = detect_environment(environ, **cfg.dist.env_options())
    dims = preflight(cfg, env.world_size)
    ctx = init_distributed(env, cfg.train.device, cfg.dist.backend, cfg.dist.timeout_s)
    try:
        dims.build_mesh(ctx.device.type)
        check_affinity(ctx, cfg.job.profile, cfg.dist.affinity)
        corpus = prepare_data(cfg)
        return Trainer(cfg, ctx, corpus, dims).fit()
    finally:
        teardown()
