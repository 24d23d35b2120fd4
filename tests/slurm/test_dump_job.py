"""`exatrain dump JOBID` on the real SLURM test cluster (docs/hangs.md): a 2-node job `exatrain submit`
started, an unmodified script (tests/distributed/plain_hang.py, none of exatrain's API) under `exatrain run
--hang-timeout` in srun mode, rank 1 (on node2) sleeping at step 3 while rank 0 (node1) waits in all_reduce.
From the login side, `exatrain dump JOBID` finds the run directory in the job's batch script, asks every node
with `srun --overlap` to make its ranks dump their stacks, and prints one diagnosis naming rank 1, its node
and its line. Then the job is cancelled (its collective timeout is far away)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.distributed.test_hangs import _line_of
from tests.slurm.test_submit import PROFILE, _exatrain

pytestmark = pytest.mark.slurm

SCRIPT = Path(__file__).resolve().parents[1] / "distributed" / "plain_hang.py"


def submit_two_node_run(
    cluster, tmp_path: Path, run: Path, options: list[str], script: Path, args: list[str]
) -> str:
    """`exatrain submit` of a 2-node srun-mode job (one rank per node, the testbed profile) whose ranks run
    `exatrain run OPTIONS --run-dir RUN -- SCRIPT ARGS` (the script copied beside the job); the job id."""
    profile = tmp_path / "testbed.toml"
    profile.write_text(PROFILE.format(visibility="gpus-per-node"))
    shutil.copy(script, tmp_path / script.name)
    command = ["exatrain", "run", *options, "--run-dir", str(run), "--", script.name, *args]
    (tmp_path / "job.toml").write_text(
        f'[job]\nnodes = 2\ngpus_per_node = 1\ntime = 10\nprofile = "{profile}"\n'
        f"command = {command!r}\n".replace("'", '"')
        + '[job.env]\nOMP_NUM_THREADS = "1"\n'
        f'[run]\ndir = "{run}"\n'
    )
    r = _exatrain(cluster, "submit", "-c", "job.toml", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.split("submitted job ")[1].split()[0]


def test_dump_of_a_job_id_names_the_stalled_rank_on_its_node(slurm_cluster, tmp_path):
    run, marker = tmp_path / "runs" / "stuck", tmp_path / "stalled"
    options, args = ["--hang-timeout", "300"], ["600", str(marker)]
    job = submit_two_node_run(slurm_cluster, tmp_path, run, options, SCRIPT, args)
    try:
        deadline = time.monotonic() + 300
        pids = run / "hang" / "attempt-0"
        while not (marker.exists() and len(list(pids.glob("pid-rank-*.json"))) == 2):
            state = slurm_cluster.state(job)
            assert time.monotonic() < deadline and state in ("PENDING", "RUNNING"), (state, job)
            time.sleep(0.5)
        dump = _exatrain(slurm_cluster, "dump", job, cwd=tmp_path)
        assert dump.returncode == 0, dump.stdout + dump.stderr
        text = dump.stdout
        assert text.startswith("exatrain: HANG (dump requested): rank 1 (node2, pid "), text
        stall = f"plain_hang.py:{_line_of('STALL-LINE', SCRIPT)} (main)"
        assert "is outside any torch.distributed call, at " in text and stall in text.split(";")[0], text
        assert "rank(s) 0 wait in torch.distributed.all_reduce at " in text and "without a stack" not in text
        assert text.strip() == (run / "hang" / "diagnosis.txt").read_text().strip()
    finally:
        slurm_cluster.run(["scancel", job])
    # a job that is not running has no ranks to dump: said at once, with a HINT
    gone = _exatrain(slurm_cluster, "dump", "999999", cwd=tmp_path)
    assert gone.returncode == 2 and "job 999999 is not in the queue" in gone.stderr and "HINT:" in gone.stderr
