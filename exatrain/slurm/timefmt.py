"""SLURM time limits: the six forms sbatch accepts, to seconds and back. Never imports torch."""

from __future__ import annotations

import re

# Every time form sbatch accepts (man sbatch, --time), as (regex, field names); nothing else is a limit.
_TIME_FORMS = tuple(
    (re.compile(pattern), names)
    for pattern, names in (
        (r"(\d+)", ("m",)),
        (r"(\d+):([0-5]?\d)", ("m", "s")),
        (r"(\d+):([0-5]?\d):([0-5]?\d)", ("h", "m", "s")),
        (r"(\d+)-(\d+)", ("d", "h")),
        (r"(\d+)-(\d+):([0-5]?\d)", ("d", "h", "m")),
        (r"(\d+)-(\d+):([0-5]?\d):([0-5]?\d)", ("d", "h", "m", "s")),
    )
)
_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_slurm_time(text: str) -> int | None:
    """Seconds of a SLURM time limit in one of sbatch's six forms; None for anything else."""
    for pattern, names in _TIME_FORMS:
        match = pattern.fullmatch(text)
        if match:
            values = dict(zip(names, map(int, match.groups())))
            if "d" in values and values["h"] > 23:
                return None
            return sum(_SECONDS[k] * v for k, v in values.items())
    return None


def format_slurm_time(seconds: int) -> str:
    """[D-]HH:MM:SS of a number of seconds."""
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text
