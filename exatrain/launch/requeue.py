"""Requeue a SLURM job from inside it (after a pre-timeout checkpoint). Never imports torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from exatrain.errors import ExatrainError

if TYPE_CHECKING:
    from exatrain.launch.runner import Runner

#: Exit code of a run that checkpointed on a pre-timeout/preemption signal but could not requeue itself
#: (no scontrol, e.g. inside a container): the generated batch script requeues the job on this code.
EXIT_REQUEUE = 75  # EX_TEMPFAIL: "try again later"


def requeue_job(job_id: str, runner: Runner | None = None) -> tuple[bool, str]:
    """Ask SLURM to requeue `job_id` with `scontrol requeue` (through the one SLURM runner); returns (done, message)."""
    from exatrain.launch.runner import CommandNotFound, SlurmRunner  # subprocess only where SLURM is really called

    try:
        r = (runner or SlurmRunner())(["scontrol", "requeue", job_id])
    except CommandNotFound:
        return False, "scontrol not found (container without SLURM tools?)"
    except ExatrainError as e:  # scontrol did not answer in time
        return False, e.message
    if r.returncode != 0:
        return False, f"scontrol requeue {job_id} failed: {(r.stderr or r.stdout).strip()}"
    return True, f"job {job_id} requeued"
