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
# The agent runs in a child process (it imports torch): torchrun's own code, driven by the CLI layer.
AGENT_MODULE = "exatrain.cli.agent"


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
    """The command that runs `python -m <module> <args>` in `nproc` workers on this node."""
    return agent_command(nproc, ["-m", module, *args], max_restarts)


def agent_command(nproc: int, target: list[str], max_restarts: int = 0) -> list[str]:
    """The command that runs ``target`` (torchrun's form: ``SCRIPT ARGS`` or ``-m MODULE ARGS``) in `nproc`
    workers on this node, under torchrun's agent in `exatrain.cli.agent` (torchrun's own arguments; a failed
    worker is named and its exit code returned).

    `--standalone` gives a private c10d rendezvous on a free local port, so concurrent runs never collide.
    """
    return [
        sys.executable, "-m", AGENT_MODULE, "--standalone", f"--nproc-per-node={check_nproc(nproc)}",
        f"--max-restarts={check_max_restarts(max_restarts)}", *target,
    ]


def cores_note(nproc: int) -> str | None:
    """A note when `nproc` workers get less than one of this process's cores each (they still run, slowly)."""
    cores = len(os.sched_getaffinity(0))
    if nproc <= cores:
        return None
    return (f"{nproc} workers share {cores} CPU core(s) of this process: each gets less than one core, so the "
            f"run is slow (fine for a smoke test; use --nproc {cores} or fewer to measure anything)")


def agent_environment(max_restarts: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The agent's environment: this process's, plus what makes restarts reconnect when they are allowed."""
    env = dict(os.environ if base is None else base)
    if max_restarts > 0:
        env.update(RESTART_SAFE_AGENT_ENV)
    return env


def launch_local(nproc: int, module: str, args: list[str], max_restarts: int = 0) -> int:
    """Run `python -m <module> <args>` in the workers to completion and return the agent's exit code."""
    return launch_target(nproc, ["-m", module, *args], max_restarts)


def launch_target(nproc: int, target: list[str], max_restarts: int = 0) -> int:
    """Run ``target`` (``SCRIPT ARGS`` or ``-m MODULE ARGS``) in the workers; 0 or the failed worker's exit code."""
    command = agent_command(nproc, target, max_restarts)
    return subprocess.run(command, env=agent_environment(max_restarts)).returncode
