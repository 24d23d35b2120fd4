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
