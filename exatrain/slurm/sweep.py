"""Sweeps as SLURM job arrays: array task i trains with the i-th value of every swept config key."""

from __future__ import annotations

from dataclasses import dataclass

from exatrain.config.load import load_config
from exatrain.errors import ConfigError


@dataclass(frozen=True)
class Sweep:
    """Swept keys (``section.key``) and, per key, one value (as written) per array task."""

    keys: tuple[str, ...]
    values: tuple[tuple[str, ...], ...]

    @property
    def size(self) -> int:
        """Number of array tasks."""
        return len(self.values[0])

    def overrides(self, task: int) -> list[str]:
        """The ``--section.key=value`` overrides of array task ``task``."""
        return [f"--{key}={vals[task]}" for key, vals in zip(self.keys, self.values)]


def parse_sweep(specs: list[str]) -> Sweep | None:
    """``["train.lr=1e-3,3e-3", "train.seed=1,2"]`` -> a Sweep of 2 tasks (keys zipped); None for no specs.

    Each task's overrides are checked like config overrides, so a typo fails here and not in every task.
    """
    if not specs:
        return None
    keys, values = [], []
    for spec in specs:
        key, sep, text = spec.removeprefix("--").partition("=")
        items = tuple(v.strip() for v in text.split(","))
        if not sep or "." not in key or not all(items):
            raise ConfigError(
                f"cannot read --array {spec!r}",
                "write --array section.key=v1,v2,... e.g. --array train.lr=1e-3,3e-3",
            )
        keys.append(key)
        values.append(items)
    if len({len(v) for v in values}) != 1:
        raise ConfigError(
            "--array keys have different numbers of values: "
            + ", ".join(f"{k} has {len(v)}" for k, v in zip(keys, values)),
            "give every swept key the same number of values (task i uses the i-th of each)",
        )
    if len(set(keys)) != len(keys):
        raise ConfigError(
            f"--array sweeps a key twice: {', '.join(keys)}", "give each key once, values comma-separated"
        )
    sweep = Sweep(tuple(keys), tuple(values))
    for task in range(sweep.size):
        load_config(None, sweep.overrides(task))  # unknown keys, wrong types: fail now, not in every task
    return sweep
