"""Start N local worker processes through torchrun's elastic agent (`torch.distributed.run`).

Never imports torch: the agent runs in a child process, so this module stays instant to import.
"""

from __future__ import annotations

import subprocess
import sys

from exatrain.errors import ConfigError


def check_nproc(nproc: int) -> int:
    """Validate a requested local process count."""
    if nproc < 1:
        raise ConfigError(f"--nproc must be at least 1, got {nproc}", "use --nproc 1 for one process or --nproc 2 for two")
    return nproc


def torchrun_command(nproc: int, module: str, args: list[str], max_restarts: int = 0) -> list[str]:
    """The command that runs `python -m <module> <args>` in `nproc` workers on this node.

    `--standalone` gives a private c10d rendezvous on a free local port, so concurrent runs never collide.
    """
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={check_nproc(nproc)}",
        f"--max-restarts={max_restarts}", "-m", module, *args,
    ]


def launch_local(nproc: int, module: str, args: list[str], max_restarts: int = 0) -> int:
    """Run the workers to completion and return the agent's exit code."""
    if max_restarts < 0:
        raise ConfigError(f"--max-restarts must be 0 or more, got {max_restarts}", "use --max-restarts 3, for example")
    return subprocess.run(torchrun_command(nproc, module, args, max_restarts)).returncode
