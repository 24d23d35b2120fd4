"""Make a process, and every process it starts, meet torch 2.4's torchrun (run24.py) and a chosen torch
version in the package metadata, as a job on a site's older torch would.

``make_overlay(dir, version)`` writes, under ``dir``: ``torch-VERSION.dist-info`` (what
``importlib.metadata.version("torch")`` finds first, as exatrain's agent reads it), a ``sitecustomize.py``
that serves ``torch.distributed.run`` from run24.py, and ``bin/torchrun`` shaped like torch's console
script. It returns the variables to add: PATH (bin first) and PYTHONPATH (the overlay, then this checkout).
The real torch 2.13 stays importable: only that one module and the version in the metadata differ.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SITECUSTOMIZE = '''"""Test overlay (tests/torch24/overlay.py): torch.distributed.run is torch 2.4's \
(tests/torch24/run24.py)."""
import importlib.abc
import importlib.util
import sys


class _Torch24Run(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch.distributed.run":
            return importlib.util.spec_from_file_location(name, {standin!r})
        return None


sys.meta_path.insert(0, _Torch24Run())
'''
TORCHRUN = """#!{python}
import sys
from torch.distributed.run import main
sys.exit(main())
"""


def make_overlay(where: Path, version: str = "2.4.0") -> dict[str, str]:
    """Write the overlay under ``where``; the environment variables that put it in front (see the module)."""
    info = where / f"torch-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    (where / "sitecustomize.py").write_text(
        SITECUSTOMIZE.format(standin=str(Path(__file__).parent / "run24.py"))
    )
    bin_dir = where / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "torchrun").write_text(TORCHRUN.format(python=sys.executable))
    (bin_dir / "torchrun").chmod(0o755)
    path = f"{bin_dir}:{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return {"PATH": path, "PYTHONPATH": f"{where}:{ROOT}"}
