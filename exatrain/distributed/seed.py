"""Seeding: the same model init everywhere, different randomness (dropout) per rank."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices) with one value."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rank_seed(seed: int, rank: int) -> int:
    """The per-rank seed used after model initialisation, so ranks draw different dropout masks."""
    return seed + 1_000_003 * rank
