"""`exatrain run`: an unmodified torch.distributed script, started right on any launcher. Never imports torch.

Outside a launcher the script runs in N local workers under torchrun's elastic agent (`launch.local`).
Inside one (a SLURM job step, an MPI job, torchrun) this process is the rank: it gives the script the
variables a torchrun-started script expects (`torch_variables`), checks the master address, the GPU
visibility and the CPU affinity with exatrain's rules, and then replaces itself with the script
(`os.execve`: same PID, so SLURM's signals reach the script, and its exit code is the task's). The script
runs under `launch.script_runner`, which behaves like ``python SCRIPT`` but exits without the interpreter's
finalization.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from exatrain.env import ClusterEnvironment
from exatrain.env.affinity import check_rank, physical_gpu
from exatrain.env.devices import (
    count_node_gpus,
    narrowed_ids,
    pick_device_index,
    visibility,
    visibility_problem,
)
from exatrain.env.master_check import check_master
from exatrain.env.nics import GLOO_IFNAME, gloo_interfaces
from exatrain.errors import ConfigError, ExatrainError
from exatrain.slurm.rank_command import script_runner_argv

_USAGE = (
    "exatrain run [--nproc N] [--max-restarts K] [--] SCRIPT.py [ARGS...]   or   exatrain run -m "
    "MODULE [ARGS...]"
)
_PYTHON_SUFFIXES = (".py", ".pyw")


@dataclass(frozen=True)
class Target:
    """What to run: a script file or a module (``python -m``), and its own arguments."""

    name: str
    is_module: bool
    args: tuple[str, ...] = ()

    def words(self) -> list[str]:
        """``SCRIPT ARGS`` or ``-m MODULE ARGS``, as torchrun and `launch.script_runner` take them."""
        return [*(["-m", self.name] if self.is_module else [self.name]), *self.args]

    def argv(self, options: list[str] | None = None) -> list[str]:
        """The interpreter arguments after the interpreter itself: `launch.script_runner` runs the target
        (see there why), with the runner's own ``options``."""
        return script_runner_argv(self.words(), options)


def check_target(target: Target | None, cwd: str | None = None) -> Target:
    """Raise ExatrainError (with a HINT) unless ``target`` names an existing Python script or module."""
    if target is None or not target.name:
        what = "-m needs a module name" if target is not None and target.is_module else "no script given"
        raise ExatrainError(f"exatrain run: {what}", f"use {_USAGE}")
    cwd = cwd or os.getcwd()
    return _check_module(target, cwd) if target.is_module else _check_script(target, cwd)


def _check_script(target: Target, cwd: str) -> Target:
    path = Path(cwd, target.name)
    if not path.exists():
        raise ExatrainError(
            f"script {target.name!r} does not exist (looked in {cwd})",
            "check the path; it is relative to the current directory (the job's working "
            "directory under SLURM)",
        )
    if path.is_dir() or not _is_python(path):
        raise ExatrainError(
            f"{target.name!r} is not a Python script (no .py suffix and no python #! line)",
            "exatrain run starts Python: give a .py file or -m MODULE; run other programs "
            "directly with srun or torchrun --no-python",
        )
    return target


def _is_python(path: Path) -> bool:
    if path.suffix in _PYTHON_SUFFIXES:
        return True
    try:
        with path.open("rb") as f:
            first = f.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def _check_module(target: Target, cwd: str) -> Target:
    # Only the top-level package is looked up: finding a submodule would import its parents (and maybe torch).
    top = target.name.split(".")[0]
    if not top.isidentifier() or importlib.machinery.PathFinder.find_spec(top, [cwd, *sys.path]) is None:
        if top.isidentifier() and top in sys.builtin_module_names:
            return target
        raise ExatrainError(
            f"no module named {top!r} (for -m {target.name}) in {cwd} or the installed packages",
            "check the module name, run from the directory that contains it, or install its "
            "package into this environment",
        )
    return target


def torch_variables(env: ClusterEnvironment) -> dict[str, str]:
    """The torch ``env://`` contract for this rank, as torchrun sets it for its workers.

    Under torchrun the variables exist already and are kept as the agent set them (its store listens at
    its MASTER_ADDR/MASTER_PORT): nothing is returned.
    """
    if env.kind == "torchelastic":
        return {}
    variables = {
        "RANK": str(env.global_rank),
        "WORLD_SIZE": str(env.world_size),
        "LOCAL_RANK": str(env.local_rank),
        "LOCAL_WORLD_SIZE": str(env.local_world_size),
        "MASTER_ADDR": env.main_address,
        "MASTER_PORT": str(env.main_port),
    }
    if env.node_rank is not None:  # MPI over several nodes exports no node index: left unset, never guessed
        variables.update(GROUP_RANK=str(env.node_rank), GROUP_WORLD_SIZE=str(env.num_nodes))
    return variables


def batch_shell_error(env: ClusterEnvironment) -> ExatrainError | None:
    """The error for a SLURM batch or salloc shell (a job but no job step), else None: run there, the
    script would be a world of one while the job's other tasks sit idle."""
    if env.kind != "local" or env.job_id is None:
        return None
    return ExatrainError(
        f"inside SLURM job {env.job_id}'s batch shell, not a job step: the script would run as one "
        "process while the job's tasks stay unused",
        "start the ranks as a job step: `srun exatrain run train.py` in the batch script, or let "
        "`exatrain submit` write the job; to run local workers here anyway, pass --nproc N",
    )


def device_notes(
    env: ClusterEnvironment, environ: Mapping[str, str], root: str = "/"
) -> tuple[list[str], int | None]:
    """Visibility warnings for this rank and the node GPU its LOCAL_RANK selects (None on CPU).

    The rules of `env.devices`: tasks that would share GPUs fail; a task that sees exactly one GPU while
    its node runs several tasks (`--gpus-per-task=1`) is told that its GPU is device 0, not LOCAL_RANK.
    """
    notes = [p for p in [visibility_problem(environ, root)] if p]
    narrowed = narrowed_ids(visibility(environ))
    count = len(narrowed) if narrowed is not None else count_node_gpus(root)
    if not count:
        return notes, None
    index = pick_device_index(env.local_rank, env.local_world_size, count)
    if index != env.local_rank:
        notes.append(
            f"this task sees one GPU while its node runs {env.local_world_size} tasks: it is device 0 "
            f"(cuda:0), not cuda:LOCAL_RANK (LOCAL_RANK={env.local_rank})\n"
            "HINT: let every task see the node's GPUs (--gpus-per-node, which `exatrain submit` uses for "
            "scripts) or select torch.device('cuda') in the script"
        )
    return notes, physical_gpu(index, environ)


def affinity_note(env: ClusterEnvironment, gpu: int | None, masks: tuple[str, ...], mode: str) -> str | None:
    """A warning when this rank's CPU affinity is not what its GPU (or local rank) expects; strict raises."""
    if mode == "off":
        return None
    report = check_rank(env.global_rank, env.hostname, gpu, env.local_rank, masks)
    if not report.mismatch:
        return None
    what = (
        f"CPU affinity of rank {report.rank} on {report.host}: expected cores {report.expected}, runs "
        f"on {report.actual} ({report.verdict})"
    )
    hint = (
        "bind each task to its cores (srun --cpu-bind=mask_cpu:..., as scripts from `exatrain sbatch` do); "
        "--affinity=off skips this check"
    )
    if mode == "strict":
        raise ExatrainError(f"{what} (--affinity=strict)", hint)
    return f"WARNING: {what}\nHINT: {hint}"


def rank_environment(
    env: ClusterEnvironment,
    environ: Mapping[str, str],
    *,
    masks: tuple[str, ...] = (),
    affinity: str = "warn",
) -> tuple[dict[str, str], list[str]]:
    """The script's environment (``environ`` plus `torch_variables`) and the warnings to print first.

    Raises ExatrainError for what cannot work: a master address other nodes cannot reach, a GLOO_SOCKET_IFNAME
    of which this node has no interface (one it has some of is narrowed to those), tasks sharing GPUs, an
    affinity mismatch under ``affinity="strict"``.
    """
    if affinity not in ("warn", "strict", "off"):
        raise ConfigError(f"--affinity must be warn, strict or off, got {affinity!r}", "use --affinity=warn")
    check_master(env)
    gloo = gloo_interfaces(environ, env.hostname)  # only the listed interfaces this node has; none: an error
    notes, gpu = device_notes(env, environ)
    note = affinity_note(env, gpu, masks, affinity)
    child = {**environ, **torch_variables(env), **({GLOO_IFNAME: gloo} if gloo else {})}
    return child, notes + ([note] if note else [])


def exec_rank(target: Target, child_env: dict[str, str], options: list[str] | None = None) -> None:
    """Replace this process with the script (same PID; its exit code becomes this task's); ``options`` are
    the script runner's (``--label``)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *target.argv(options)], child_env)
