"""Named sizes of the reference model (torch-free, so the CLI can validate a size before launching)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from exatrain.errors import ConfigError


@dataclass(frozen=True)
class ModelShape:
    """Width, depth and heads of one named size; the vocabulary comes from the data."""

    dim: int
    n_layers: int
    n_heads: int
    mlp_ratio: int = 4


SIZES: dict[str, ModelShape] = {
    "tiny": ModelShape(dim=128, n_layers=2, n_heads=4),  # CI and laptops: ~0.5M params + embeddings
    "small": ModelShape(dim=256, n_layers=4, n_heads=4),  # ~3M
    "medium": ModelShape(dim=512, n_layers=8, n_heads=8),  # ~25M
    "large": ModelShape(dim=1024, n_layers=16, n_heads=16),  # ~200M
    "xl": ModelShape(dim=2048, n_layers=18, n_heads=16),  # ~0.9B + embeddings: ~1B with a 32k vocabulary
}


def model_shape(size: str, n_layers: int = 0, dim: int = 0, n_heads: int = 0) -> ModelShape:
    """Look up a named size, optionally with another depth, width or head count (0 keeps the size's own),
    failing with the list of valid names or a HINT for an override that cannot work."""
    if size not in SIZES:
        raise ConfigError(f"unknown model size {size!r} (model.size)", "use one of: " + ", ".join(SIZES))
    if n_layers < 0:
        raise ConfigError(
            f"model.n_layers must be 0 (the size's depth) or positive, got {n_layers}",
            "use e.g. --model.n_layers=4",
        )
    for key, value, example in (("dim", dim, 192), ("n_heads", n_heads, 6)):
        if value < 0:
            raise ConfigError(
                f"model.{key} must be 0 (the size's own) or positive, got {value}",
                f"use e.g. --model.{key}={example}",
            )
    overrides = {k: v for k, v in (("n_layers", n_layers), ("dim", dim), ("n_heads", n_heads)) if v}
    shape = replace(SIZES[size], **overrides)
    if shape.dim % shape.n_heads:
        raise ConfigError(
            f"model width {shape.dim} (model.dim) is not divisible by its {shape.n_heads} "
            f"attention heads (model.n_heads; model.size={size!r})",
            "pick a head count that divides the width, e.g. --model.dim=192 --model.n_heads=6",
        )
    return shape


def configured_shape(model_cfg) -> ModelShape:
    """The shape a `[model]` config section describes: its named size with its overrides."""
    return model_shape(model_cfg.size, model_cfg.n_layers, model_cfg.dim, model_cfg.n_heads)
