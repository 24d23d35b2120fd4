"""Requeue a SLURM job from inside it (after a pre-timeout checkpoint). Never imports torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from exatrain.errors import ExatrainError

if TYPE_CHECKING:
    from exatrain.slurm.runner import Runner

#: Exit code of a run that checkpointed on a pre-timeout/preemption signal but could not requeue itself
#: (no scontrol, e.g. inside a container): the generated batch script requeues the job on this code.
EXIT_REQUEUE = 75  # EX_TEMPFAIL: "try again later"

#: File in the run directory that says the same where an exit code cannot carry it: torchrun's agent exits 1
#: after forwarding a signal, whatever its workers returned. Written by rank 0 after the checkpoint is
#: committed; the batch script (and `exatrain train --nproc`) act on it and remove it.
REQUEUE_MARKER = "requeue-requested"

#: File in the run directory the hang diagnosis writes (see observe.hang): the node(s) it blames, comma-
#: separated, or an empty line. Its existence says "this launch stopped on a hang" where the exit code (76)
#: cannot (torchrun's agent); with job.hang_requeues the batch script requeues the job without those nodes.
HANG_EXCLUDE = "hang/exclude"
#: File in the run directory with one line per requeue after
#: a hang: the job id (job.hang_requeues caps them per job).
HANG_REQUEUES = "hang/requeues"

#: The signals torchrun's agent handles by default (torch 2.13); others (USR2) kill it.
AGENT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


def agent_signals(handled: str) -> str:
    """The signals torchrun's agent must not die of: its defaults plus every signal the trainer treats as
    'time is up' (checkpoint.signals), so the agent forwards them to the workers instead of dying of them."""
    names = [n.strip().upper() for n in handled.split(",") if n.strip()]
    extra = ["SIG" + n.removeprefix("SIG") for n in names]
    return ",".join(dict.fromkeys([*AGENT_SIGNALS, *extra]))


def requeue_job(job_id: str, runner: Runner | None = None) -> tuple[bool, str]:
    """Ask SLURM to requeue `job_id` with `scontrol requeue` (through the one SLURM runner); returns (done,
    message)."""
    from exatrain.slurm.runner import (  # subprocess only where SLURM is really called
        CommandNotFound,
        SlurmRunner,
    )

    try:
        r = (runner or SlurmRunner())(["scontrol", "requeue", job_id])
    except CommandNotFound:
        return False, "scontrol not found (container without SLURM tools?)"
    except ExatrainError as e:  # scontrol did not answer in time
        return False, e.message
    if r.returncode != 0:
        return False, f"scontrol requeue {job_id} failed: {(r.stderr or r.stdout).strip()}"
    return True, f"job {job_id} requeued"
