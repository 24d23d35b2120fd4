"""Setting communication variables for libraries that read them from the process environment.

Only distributed/ writes os.environ (README, "Layout and tests"); an outside engine (engines/deepspeed,
engines/horovod) computes the values its library reads and hands them here, so every write of the process
environment stays in this layer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from exatrain.env.torch_version import parse_torch_version, torch_at_least


def set_variables(values: Mapping[str, str], overwrite: bool = True) -> None:
    """Put `values` into this process's environment; with overwrite=False a variable already set is kept
    (a user's own setting wins over exatrain's default)."""
    for name, value in values.items():
        if overwrite:
            os.environ[name] = value
        else:
            os.environ.setdefault(name, value)


#: torch's flight recorder buffer (entries per process group). Newer releases read TORCH_FR_BUFFER_SIZE first
#: and warn, on every rank, that TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated when that one is set (seen with
#: torch 2.11 on an H100); older releases read only TORCH_NCCL_TRACE_BUFFER_SIZE.
FLIGHT_RECORDER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
#: entries kept: enough for the last steps' collectives of a large job (torchtitan's default is 20000)
FLIGHT_RECORDER_ENTRIES = "2000"
#: the first release given the new name here. From torch 2.6 on, NCCL's recorder keeps 2000 entries by
#: default, so a release of 2.8 or later that would not know the new name still records.
_FR_NAME_SINCE = (2, 8)


def flight_recorder_variables(
    environ: Mapping[str, str], backend: str, torch_version: str | None = None
) -> dict[str, str]:
    """What turns NCCL's (RCCL's) flight recorder on, so that a hang's diagnosis can name the collective each
    rank is in (gloo's is on by default): the one buffer-size name the torch where this rank runs reads
    without a deprecation warning (`torch_version`, default this process's torch), unless the user set
    either (also to 0, to turn it off)."""
    if backend != "nccl" or any(environ.get(name, "").strip() for name in FLIGHT_RECORDER_VARS):
        return {}
    if torch_version is None:
        import torch

        torch_version = torch.__version__
    new_name, old_name = FLIGHT_RECORDER_VARS
    name = new_name if torch_at_least(parse_torch_version(torch_version), _FR_NAME_SINCE) else old_name
    return {name: FLIGHT_RECORDER_ENTRIES}
