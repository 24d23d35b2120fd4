"""Attaching to a running job's nodes from a login node (`exatrain monitor`, `exatrain dump JOBID`): the job's
state, size and run directory, and the `srun --overlap` line that runs one task per node inside it.
Never imports torch."""

from __future__ import annotations

import shlex

from exatrain.errors import ExatrainError
from exatrain.slurm.runner import Runner


def job_nodes(runner: Runner, job_id: str, what: str = "no GPUs to watch") -> int:
    """Number of nodes of a RUNNING job; a job that is not running is an ExatrainError with a HINT (`what`
    says what a job that does not run yet lacks)."""
    r = runner(["squeue", "-h", "-j", str(job_id), "-o", "%T %D"])
    fields = r.stdout.split()
    if r.returncode != 0 or len(fields) != 2:
        raise ExatrainError(
            f"job {job_id} is not in the queue ({(r.stderr or r.stdout).strip() or 'no such job'})",
            "give the id of a running job: exatrain status lists yours",
        )
    state, nodes = fields
    if state != "RUNNING":
        raise ExatrainError(
            f"job {job_id} is {state}, not RUNNING: it has {what} yet",
            "wait until `exatrain status` shows it RUNNING",
        )
    return int(nodes)


def on_every_node(job_id: str, nodes: int, command: list[str]) -> list[str]:
    """`srun --overlap` of `command`, one task per node of the running job (sharing its resources with the
    running step), each output line labelled with its task."""
    return [
        "srun",
        "--overlap",
        f"--jobid={job_id}",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        f"--ntasks={nodes}",
        "--label",
        "--quiet",
        *command,
    ]


def job_run_dir(runner: Runner, job_id: str) -> str:
    """The run directory of a job `exatrain submit` wrote (the `RUN_DIR=` line of its batch script, which
    `scontrol write batch_script` prints; an array task's is RUN_DIR/array-K)."""
    r = runner(["scontrol", "write", "batch_script", str(job_id), "-"])
    lines = r.stdout.splitlines() if r.returncode == 0 else []
    found = [line.split("=", 1)[1] for line in lines if line.startswith("RUN_DIR=")]
    if not found:
        raise ExatrainError(
            f"job {job_id}: no run directory in its batch script "
            f"({(r.stderr.strip() or 'no RUN_DIR= line')})",
            "for a job `exatrain submit` did not write, run `exatrain dump RUN_DIR` on a node of the job "
            "(RUN_DIR: the --run-dir of its `exatrain run`)",
        )
    run_dir = shlex.split(found[0])[0]
    if len(found) > 1:  # RUN_DIR="$RUN_DIR"/array-"$SLURM_ARRAY_TASK_ID" of a job array
        task = runner(["squeue", "-h", "-j", str(job_id), "-o", "%K"]).stdout.strip()
        run_dir = f"{run_dir}/array-{task}"
    return run_dir
