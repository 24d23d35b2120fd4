"""Start N local worker processes through torchrun's elastic agent (`torch.distributed.run`).

Never imports torch: the agent runs in a child process, so this module stays instant to import.
"""

from __future__ import annotations

import os
import subprocess
import sys

from exatrain.errors import ConfigError

# torchrun's c10d rendezvous shares one TCPStore between the agent and its workers, and keeps it across
# restarts without a per-attempt key prefix (torch 2.13; pytorch/pytorch#135712). A restarted group then
# reads the dead group's addresses from it (gloo: "connectFullMesh ... Connection refused"). With sharing
# off, every rendezvous round gets a fresh store hosted by the new rank 0.
RESTART_SAFE_AGENT_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def check_nproc(nproc: int) -> int:
    """Validate a requested local process count."""
    if nproc < 1:
        raise ConfigError(f"--nproc must be at least 1, got {nproc}", "use --nproc 1 for one process or --nproc 2 for two")
    return nproc


def check_max_restarts(max_restarts: int) -> int:
    """Validate a requested number of elastic restarts."""
    if max_restarts < 0:
        raise ConfigError(f"--max-restarts must be 0 or more, got {max_restarts}", "use --max-restarts 3, for example")
    return max_restarts


def torchrun_command(nproc: int, module: str, args: list[str], max_restarts: int = 0) -> list[str]:
    """The command that runs `python -m <module> <args>` in `nproc` workers on this node.

    `--standalone` gives a private c10d rendezvous on a free local port, so concurrent runs never collide.
    """
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={check_nproc(nproc)}",
        f"--max-restarts={check_max_restarts(max_restarts)}", "-m", module, *args,
    ]


def agent_environment(max_restarts: int, base: dict[str, str] | None = None, nproc: int = 1) -> dict[str, str]:
    """The agent's environment: this process's, plus what makes restarts reconnect when they are allowed,
    plus OMP_NUM_THREADS for the workers (see threads_per_worker) unless the caller set it."""
    env = dict(os.environ if base is None else base)
    if max_restarts > 0:
        env.update(RESTART_SAFE_AGENT_ENV)
    if nproc > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(threads_per_worker(nproc))
    return env


def threads_per_worker(nproc: int, cores: int | None = None) -> int:
    """OpenMP threads per worker: the cores this process may use shared evenly, at least one. (torchrun
    would set 1 and print a banner from every run; this is the same intent, chosen and said once.)"""
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    return max(1, cores // nproc)


def launch_local(nproc: int, module: str, args: list[str], max_restarts: int = 0) -> int:
    """Run the workers to completion and return the agent's exit code."""
    command = torchrun_command(nproc, module, args, max_restarts)
    env = agent_environment(max_restarts, nproc=nproc)
    if nproc > 1 and "OMP_NUM_THREADS" not in os.environ:
        print(f"exatrain: OMP_NUM_THREADS={env['OMP_NUM_THREADS']} per worker ({len(os.sched_getaffinity(0))} cores "
              f"/ {nproc} workers); export OMP_NUM_THREADS to choose another count", file=sys.stderr)
    return subprocess.run(command, env=env).returncode
