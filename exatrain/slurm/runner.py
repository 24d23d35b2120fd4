"""The one way exatrain runs SLURM's commands (sbatch, squeue, scontrol, scancel, sacct).

Everything that talks to SLURM takes a runner argument: :class:`SlurmRunner` runs the real commands,
tests pass a fake with the same call signature. Never imports torch.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from exatrain.errors import ExatrainError

COMMANDS = ("sbatch", "squeue", "scontrol", "scancel", "sacct", "srun")


@dataclass(frozen=True)
class CommandResult:
    """What a SLURM command returned."""

    returncode: int
    stdout: str
    stderr: str


class CommandNotFound(ExatrainError):
    """The SLURM command is not on PATH (not a SLURM machine, or a container without SLURM's tools)."""


class Runner(Protocol):
    """Runs one SLURM command (``args[0]`` is its name) and returns its result; never raises on a non-zero
    exit."""

    def __call__(self, args: Sequence[str], *, input: str | None = None) -> CommandResult: ...


class SlurmRunner:
    """Runs SLURM commands as subprocesses with an optional environment (e.g. SLURM_CONF) and a timeout."""

    def __init__(self, env: Mapping[str, str] | None = None, timeout_s: float = 60.0):
        self.env = dict(env) if env is not None else None
        self.timeout_s = timeout_s

    def __call__(self, args: Sequence[str], *, input: str | None = None) -> CommandResult:
        """Run ``args``; a missing command or a timeout is an ExatrainError with a HINT."""
        if args[0] not in COMMANDS:
            raise ValueError(f"not a SLURM command: {args[0]!r}")
        path = shutil.which(args[0], path=(self.env or {}).get("PATH"))
        if path is None:
            hint = "run this on a login node of the cluster"
            if args[0] == "sbatch":  # only submit has a mode without SLURM
                hint += ", or use `exatrain submit --dry-run` (or `exatrain sbatch`) to only print the script"
            raise CommandNotFound(
                f"{args[0]} not found on PATH: this machine has no SLURM client commands", hint
            )
        try:
            done = subprocess.run(
                [path, *args[1:]],
                input=input,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
            )
        except subprocess.TimeoutExpired:
            raise ExatrainError(
                f"{' '.join(args)} did not answer within {self.timeout_s:g} s",
                "the SLURM controller may be overloaded or unreachable; try again later",
            ) from None
        return CommandResult(done.returncode, done.stdout, done.stderr)
