"""Named sizes of the reference model (torch-free, so the CLI can validate a size before launching)."""

from __future__ import annotations

from dataclasses import dataclass

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


def model_shape(size: str) -> ModelShape:
    """Look up a named size, failing with the list of valid names."""
    if size not in SIZES:
        raise ConfigError(f"unknown model size {size!r} (model.size)", "use one of: " + ", ".join(SIZES))
    return SIZES[size]
