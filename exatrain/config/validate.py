"""Small value checks shared by the layers that validate configuration (preflight, ParallelDims)."""

from __future__ import annotations

from exatrain.errors import ConfigError


def check_choice(key: str, value: str, valid: tuple[str, ...]) -> None:
    """Raise ConfigError naming `key` and the valid values when `value` is not one of them."""
    if value not in valid:
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(valid)}", f"use e.g. --{key}={valid[0]}")


#: the shortest hang timeout accepted: the watcher checks a few times per timeout, at least every 0.5 s
MIN_HANG_TIMEOUT_S = 2.0


def check_hang_timeout(
    timeout_s: float, source: str, limit_s: float | None = None, limit_source: str = ""
) -> float:
    """A hang timeout in seconds, or ConfigError naming `source`: below MIN_HANG_TIMEOUT_S, or not below the
    job's time limit `limit_s` (a hang would then burn the whole allocation undetected)."""
    if not timeout_s >= MIN_HANG_TIMEOUT_S:
        raise ConfigError(
            f"{source} = {timeout_s:g} s: a hang timeout must be at least {MIN_HANG_TIMEOUT_S:g} s",
            "choose well above your longest step, checkpoint and evaluation (e.g. 300)",
        )
    if limit_s is not None and timeout_s >= limit_s:
        raise ConfigError(
            f"{source} = {timeout_s:g} s is not shorter than {limit_source} ({limit_s:.0f} s): a hang "
            "would run until the time limit undetected",
            f"choose a hang timeout well below {limit_source}, e.g. {max(limit_s / 10, 60):.0f}",
        )
    return float(timeout_s)
