"""Requeue a SLURM job from inside it (after a pre-timeout checkpoint). Never imports torch."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

#: Exit code of a run that checkpointed on a pre-timeout/preemption signal but could not requeue itself
#: (no scontrol, e.g. inside a container): the generated batch script requeues the job on this code.
EXIT_REQUEUE = 75  # EX_TEMPFAIL: "try again later"

Runner = Callable[[list[str]], subprocess.CompletedProcess]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def requeue_job(job_id: str, runner: Runner = _run) -> tuple[bool, str]:
    """Ask SLURM to requeue `job_id` with `scontrol requeue`; returns (done, message)."""
    if runner is _run and shutil.which("scontrol") is None:
        return False, "scontrol not found (container without SLURM tools?)"
    r = runner(["scontrol", "requeue", job_id])
    if r.returncode != 0:
        return False, f"scontrol requeue {job_id} failed: {(r.stderr or r.stdout).strip()}"
    return True, f"job {job_id} requeued"
