"""Shared helpers: run the real `exatrain` command line in a subprocess."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_exatrain(args, cwd, timeout=600, env=None, wrap=()):
    """Run `python -m exatrain.cli.main ARGS` with a clean environment (no inherited launcher variables),
    optionally under a wrapper command such as `taskset -c 1`."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "TORCHELASTIC_", "OMPI_", "PMI_", "MASTER_"))
            and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")}
    base.update(env or {})
    return subprocess.run([*wrap, sys.executable, "-m", "exatrain.cli.main", *args], cwd=cwd, env=base,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def exatrain_cli(tmp_path):
    """Call the CLI with cwd=tmp_path; returns CompletedProcess."""
    return lambda *args, **kw: run_exatrain(list(args), kw.pop("cwd", tmp_path), **kw)
