"""The hang watcher that `exatrain run --hang-timeout` starts, on the real SLURM test cluster (docs/hangs.md):
a 2-node job `exatrain submit` started, srun mode, each rank `exatrain run --hang-timeout 20 --run-dir RUN --
hang_restart_loop.py RUN 12` (the user's loop of tests/distributed/test_hangs.py, without a timeout argument:
the script starts no watcher of its own, so the one declaring the hang is the one `exatrain run` asked for
through its variables, at the script's first `exatrain.step()` mark). Rank 1 (on node2) sleeps at step 7;
its watcher declares the hang, rank 0 (node1) follows the `declared` file, both ranks exit with code 76,
srun and the batch script pass it on, and the job fails with exit code 76. The diagnosis names rank 1 on
node2, step 7 and the stall's line.

Not reproduced: GPUs and NCCL's flight recorder (gloo's is used), a really broken node (the stall is a sleep).
"""

from __future__ import annotations

import pytest

from exatrain.errors import EXIT_HANG
from tests.distributed.test_hangs import RESTART_SCRIPT, _line_of
from tests.slurm.test_dump_job import submit_two_node_run

pytestmark = pytest.mark.slurm

TIMEOUT_S = 20


def test_exatrain_run_watcher_declares_a_hang_under_srun(slurm_cluster, tmp_path):
    run = tmp_path / "runs" / "hung"
    # no third argument: the script starts no watch_hangs of its own
    job = submit_two_node_run(
        slurm_cluster, tmp_path, run, ["--hang-timeout", str(TIMEOUT_S)], RESTART_SCRIPT, [str(run), "12"]
    )
    state = slurm_cluster.wait(job, timeout=180)
    log_path = tmp_path / "runs" / f"exatrain-{job}.out"
    log = log_path.read_text() if log_path.is_file() else f"(no {log_path})"
    [info] = slurm_cluster.job_info(job)
    assert state == "FAILED" and info["ExitCode"] == f"{EXIT_HANG}:0", (state, info.get("ExitCode"), log)
    diagnosis = (run / "hang" / "diagnosis.txt").read_text()
    stall = f"hang_restart_loop.py:{_line_of('STALL-LINE', RESTART_SCRIPT)} (main): time.sleep(3600)"
    assert diagnosis.startswith(
        f"exatrain: HANG (no progress for over {TIMEOUT_S} s): rank 1 (node2, pid "
    ), diagnosis
    assert " at step 7 " in diagnosis.split(";")[0] and stall in diagnosis.split(";")[0], diagnosis
    assert "Suspect node(s): node2 " in diagnosis, diagnosis
    assert diagnosis.strip() in log, log[-4000:]  # the job's output says it too
    # the watcher was `exatrain run`'s: each rank's heartbeat and stacks under the given run directory
    attempt = run / "hang" / "attempt-0"
    for rank in (0, 1):
        assert (attempt / f"beat-rank-{rank}.json").is_file() and (
            attempt / f"stacks-rank-{rank}.txt"
        ).is_file()
