"""`exatrain dump JOBID`: every rank's Python stacks of a running SLURM job, from a login node.

The job's run directory comes from its batch script (slurm.attach.job_run_dir); one task per node of the job
(`srun --overlap`) makes that node's ranks dump their stacks into RUN_DIR/hang/ (launch.stack_dump.signal_run:
SIGUSR1 to the ranks' faulthandler, py-spy for a stopped one), and this process, which sees the run directory
on the shared file system, writes and prints the one diagnosis. Torch-free, like `exatrain dump RUN_DIR`.
"""

from __future__ import annotations

import sys

from exatrain.errors import ExatrainError
from exatrain.launch.stack_dump import dump_run
from exatrain.slurm.attach import job_nodes, job_run_dir, on_every_node
from exatrain.slurm.runner import Runner

#: what each node of the job runs: this interpreter's exatrain (the login node's, on the shared file system)
NODE_COMMAND = [sys.executable, "-m", "exatrain.cli.main", "dump", "--this-node"]


def dump_job(runner: Runner, job_id: str) -> tuple[str, bool]:
    """Signal the ranks of running job `job_id` on all its nodes, then diagnose: (text, every stack read)."""
    nodes = job_nodes(runner, job_id, what="no ranks to dump")
    run_dir = job_run_dir(runner, job_id)
    r = runner(on_every_node(job_id, nodes, [*NODE_COMMAND, run_dir]))
    if r.returncode != 0:
        raise ExatrainError(
            f"srun --overlap --jobid={job_id} failed: {r.stderr.strip()[-500:]}",
            "the job may have ended (exatrain status); or run `exatrain dump RUN_DIR` on each of its nodes",
        )
    text, complete = dump_run(run_dir, ask=False)
    if not text:
        raise ExatrainError(
            f"job {job_id}: no ranks recorded in {run_dir}/hang/",
            "the job's ranks record their pids only under `exatrain run` (not with --hang-timeout 0), with "
            'RUN_DIR its --run-dir (job.command = ["exatrain", "run", "--run-dir", RUN_DIR, "--", '
            '"train.py"])',
        )
    return text, complete
