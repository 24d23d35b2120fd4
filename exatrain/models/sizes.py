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


def model_shape(size: str, n_layers: int = 0) -> ModelShape:
    """Look up a named size (optionally with another depth), failing with the list of valid names."""
    if size not in SIZES:
        raise ConfigError(f"unknown model size {size!r} (model.size)", "use one of: " + ", ".join(SIZES))
    if n_layers < 0:
        raise ConfigError(f"model.n_layers must be 0 (the size's depth) or positive, got {n_layers}",
                          "use e.g. --model.n_layers=4")
    return replace(SIZES[size], n_layers=n_layers) if n_layers else SIZES[size]
