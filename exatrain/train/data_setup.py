"""The configured corpus and its cache folder: torch-free, so the launching process can prepare the data
(fail early, fill the cache once) without importing torch before its workers start."""

from __future__ import annotations

from pathlib import Path

from exatrain.config import Config
from exatrain.data import Corpus, load_corpus


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
