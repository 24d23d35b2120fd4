"""The one lazy-export mechanism of exatrain's packages (PEP 562).

A package lists which submodule defines each public name; the name is imported on first use, so importing
the package stays cheap (no torch) until a name that needs it is touched.

    _EXPORTS = {"JobSpec": "exatrain.slurm.spec", ...}
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable, Callable]:
    """`__getattr__` and `__dir__` for `package`: `exports` maps each public name to its defining module."""

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
