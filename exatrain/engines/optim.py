"""AdamW with decoupled weight decay on matrices only, and a warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from exatrain.config import TrainConfig


def build_optimizer(model: nn.Module | list[nn.Module], cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over the parameters of a model (or of a rank's model parts); norms, biases and other 1-D
    tensors are not decayed."""
    parts = model if isinstance(model, list) else [model]
    params = [p for part in parts for p in part.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused_ok(params) or None)


def fused_ok(params: list[torch.Tensor]) -> bool:
    """True when every parameter lives on a CUDA GPU: then AdamW's fused kernel updates all of them in a few
    launches and keeps its step counters on the GPU (no host work per tensor). On CPUs (and for CPU-offloaded
    FSDP) torch's default, the foreach implementation, stays: CPU numerics are what the parity tests pin."""
    return bool(params) and all(p.device.type == "cuda" for p in params)


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of the peak LR at optimizer step `step` (0-based): linear warmup, then cosine to the
    floor."""
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    decay_steps = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / decay_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """The schedule as a LambdaLR, so its state travels with checkpoints like any torch scheduler."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))
