"""Setting communication variables for libraries that read them from the process environment.

Only distributed/ writes os.environ (README, "Layout and tests"); an outside engine (engines/deepspeed,
engines/horovod) computes the values its library reads and hands them here, so every write of the process
environment stays in this layer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def set_variables(values: Mapping[str, str], overwrite: bool = True) -> None:
    """Put `values` into this process's environment; with overwrite=False a variable already set is kept
    (a user's own setting wins over exatrain's default)."""
    for name, value in values.items():
        if overwrite:
            os.environ[name] = value
        else:
            os.environ.setdefault(name, value)


#: torch's flight recorder buffer (entries per process group): torch 2.13 reads TORCH_FR_BUFFER_SIZE, then
#: TORCH_NCCL_TRACE_BUFFER_SIZE (its distributed_c10d.py); older releases read only the latter.
FLIGHT_RECORDER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
#: entries kept: enough for the last steps' collectives of a large job (torchtitan's default is 20000)
FLIGHT_RECORDER_ENTRIES = "2000"


def flight_recorder_variables(environ: Mapping[str, str], backend: str) -> dict[str, str]:
    """What turns NCCL's (RCCL's) flight recorder on, so that a hang's diagnosis can name the collective each
    rank is in (gloo's is on by default): both buffer-size names, unless the user set either (also to 0, to
    turn it off)."""
    if backend != "nccl" or any(environ.get(name, "").strip() for name in FLIGHT_RECORDER_VARS):
        return {}
    return dict.fromkeys(FLIGHT_RECORDER_VARS, FLIGHT_RECORDER_ENTRIES)
