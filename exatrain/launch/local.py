"""Start N local worker processes through torchrun's elastic agent (`torch.distributed.run`).

Never imports torch: the agent runs in a child process, so this module stays instant to import.

Same concept as env/local.py, one layer apart: that module describes a local run's environment; this one
starts local workers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from exatrain.errors import ConfigError
from exatrain.slurm.requeue import EXIT_REQUEUE, REQUEUE_MARKER, agent_signals
from exatrain.slurm.torchrun_line import AGENT_MODULE, DEFAULT_GRACE, agent_options

# torchrun's c10d rendezvous shares one TCPStore between the agent and its workers, and keeps it across
# restarts without a per-attempt key prefix (torch 2.13; pytorch/pytorch#135712). A restarted group then
# reads the dead group's addresses from it (gloo: "connectFullMesh ... Connection refused"). With sharing
# off, every rendezvous round gets a fresh store hosted by the new rank 0.
RESTART_SAFE_AGENT_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def check_nproc(nproc: int) -> int:
    """Validate a requested local process count."""
    if nproc < 1:
        raise ConfigError(
            f"--nproc must be at least 1, got {nproc}", "use --nproc 1 for one process or --nproc 2 for two"
        )
    return nproc


def check_max_restarts(max_restarts: int) -> int:
    """Validate a requested number of elastic restarts."""
    if max_restarts < 0:
        raise ConfigError(
            f"--max-restarts must be 0 or more, got {max_restarts}", "use --max-restarts 3, for example"
        )
    return max_restarts


def torchrun_command(
    nproc: int, module: str, args: list[str], max_restarts: int = 0, signals: str = ""
) -> list[str]:
    """The command that runs `python -m <module> <args>` in `nproc` workers on this node."""
    return agent_command(nproc, ["-m", module, *args], max_restarts, signals)


def agent_command(nproc: int, target: list[str], max_restarts: int = 0, signals: str = "") -> list[str]:
    """The command that runs ``target`` (torchrun's form: ``SCRIPT ARGS`` or ``-m MODULE ARGS``) in `nproc`
    workers on this node, under torchrun's agent in `exatrain.launch.agent` (torchrun's own arguments; a
    failed worker is named and its exit code returned).

    `--standalone` gives a private c10d rendezvous on a free local port, so concurrent runs never collide.
    ``signals`` (checkpoint.signals) are forwarded by the agent to the workers instead of killing it, which
    then waits up to torchrun's default 30 s for them (torchrun's options where this torch has them, else
    exatrain's agent itself: `launch.agent`).
    """
    return [
        sys.executable,
        "-m",
        AGENT_MODULE,
        *agent_options(signals, DEFAULT_GRACE),
        "--",
        "--standalone",
        f"--nproc-per-node={check_nproc(nproc)}",
        f"--max-restarts={check_max_restarts(max_restarts)}",
        *target,
    ]


def cores_note(nproc: int) -> str | None:
    """A note when `nproc` workers get less than one of this process's cores each (they still run, slowly)."""
    cores = len(os.sched_getaffinity(0))
    if nproc <= cores:
        return None
    return (
        f"{nproc} workers share {cores} CPU core(s) of this process: each gets less than one core, so the "
        f"run is slow (fine for a smoke test; use --nproc {cores} or fewer to measure anything)"
    )


def agent_environment(
    max_restarts: int, base: dict[str, str] | None = None, nproc: int = 1, own_store: bool = False
) -> dict[str, str]:
    """The agent's environment: this process's, plus what makes restarts reconnect when they are allowed,
    plus OMP_NUM_THREADS for the workers (see threads_per_worker) unless the caller set it.

    ``own_store``: the workers' process groups bring their own store (a script that starts its own processes:
    shared, the agent's store would hold them waiting), so the agent keeps its store to itself too."""
    env = dict(os.environ if base is None else base)
    if max_restarts > 0 or own_store:
        env.update(RESTART_SAFE_AGENT_ENV)
    if nproc > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(threads_per_worker(nproc))
    return env


def threads_per_worker(nproc: int, cores: int | None = None) -> int:
    """OpenMP threads per worker: the cores this process may use shared evenly, at least one. (torchrun
    would set 1 and print a banner from every run; this is the same intent, chosen and said once.)"""
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    return max(1, cores // nproc)


def _run_forwarding(command: list[str], env: dict[str, str], signals: str) -> int:
    """Run the agent; the signals it handles, sent to this process (`kill -USR2 PID`), are passed on to it."""
    proc = subprocess.Popen(command, env=env)
    sigs = [signal.Signals[name] for name in signals.split(",")]
    previous = {sig: signal.signal(sig, lambda signum, frame: proc.send_signal(signum)) for sig in sigs}
    try:
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def launch_local(
    nproc: int,
    module: str,
    args: list[str],
    max_restarts: int = 0,
    signals: str = "",
    run_dir: str | None = None,
) -> int:
    """Run `python -m <module> <args>` in the workers to completion (see launch_target)."""
    return launch_target(nproc, ["-m", module, *args], max_restarts, signals, run_dir)


def launch_target(
    nproc: int,
    target: list[str],
    max_restarts: int = 0,
    signals: str = "",
    run_dir: str | None = None,
    own_store: bool = False,
    extra_env: dict[str, str] | None = None,
) -> int:
    """Run ``target`` (``SCRIPT ARGS`` or ``-m MODULE ARGS``) in the workers; 0, the failed worker's exit
    code, or EXIT_REQUEUE where the workers checkpointed on a signal (their marker in ``run_dir``; the agent
    itself exits 1 then). ``own_store``: see agent_environment."""
    marker = Path(run_dir) / REQUEUE_MARKER if run_dir else None
    if marker:
        marker.unlink(missing_ok=True)
    command = agent_command(nproc, target, max_restarts, signals)
    env = {**agent_environment(max_restarts, nproc=nproc, own_store=own_store), **(extra_env or {})}
    if nproc > 1 and "OMP_NUM_THREADS" not in os.environ:
        print(
            f"exatrain: OMP_NUM_THREADS={env['OMP_NUM_THREADS']} per worker "
            f"({len(os.sched_getaffinity(0))} cores "
            f"/ {nproc} workers); export OMP_NUM_THREADS to choose another count",
            file=sys.stderr,
        )
    code = _run_forwarding(command, env, agent_signals(signals))
    if marker and marker.exists():
        marker.unlink()
        print(
            f"exatrain: the workers checkpointed on a signal: continue with --checkpoint.resume=auto "
            f"(exit code {EXIT_REQUEUE})",
            file=sys.stderr,
        )
        return EXIT_REQUEUE
    return code
