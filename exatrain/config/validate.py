"""Small value checks shared by the layers that validate configuration (preflight, ParallelDims)."""

from __future__ import annotations

from exatrain.errors import ConfigError


def check_choice(key: str, value: str, valid: tuple[str, ...]) -> None:
    """Raise ConfigError naming `key` and the valid values when `value` is not one of them."""
    if value not in valid:
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(valid)}", f"use e.g. --{key}={valid[0]}")
