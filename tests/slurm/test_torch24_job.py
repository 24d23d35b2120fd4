"""torchrun-mode jobs on the SLURM test cluster whose python has torch 2.4, the oldest pyproject.toml allows
(tests/torch24: a stand-in for 2.4's torchrun first on PATH and in place of torch.distributed.run, with torch
2.4.0 in the package metadata; run24.py says what it does not reproduce), and one whose torch is older still.

c227ac3's launch line dies at once there (2.4's torchrun refuses --signals-to-handle); exatrain's script, as
`exatrain submit` renders it today, runs, and its pre-timeout cycle works: USR2 (scancel -s USR2, what
--signal=USR2@60 sends near the limit) reaches every worker through exatrain's agent, which waits for
their checkpoint; rank 0's requeue-requested makes the batch script requeue; the requeued job completes.
The workers are tests/torch24/usr2_worker.py (torch-free, a checkpoint of 2 s), to keep the test short."""

import json
import sys
import time
from pathlib import Path

import pytest

from tests.slurm.test_submit import PROFILE, _exatrain
from tests.torch24.overlay import make_overlay

pytestmark = pytest.mark.slurm

WORKER = Path(__file__).parents[1] / "torch24" / "usr2_worker.py"
JOB = """[job]
nodes = 2
time = 10
profile = "{profile}"
launch = "torchrun"
signal = "USR2@60"
command = {command}
[job.env]
OMP_NUM_THREADS = "1"
CHECKPOINT_DELAY = "2"
"""
# c227ac3's torchrun-mode launch (its lumi-g golden, reduced to the testbed), as every older torch met it.
C227AC3_JOB = """#!/bin/bash
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --time=00:05:00
#SBATCH --output=%x-%j.out
srun --ntasks-per-node=1 \\
    bash -c 'exec torchrun --rdzv-conf=is_host="$([ "$SLURM_NODEID" = 0 ] && echo true || echo false)" "$@"' \
torchrun \\
    --nnodes="$SLURM_NNODES" --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint="$(hostname)":29517 \
--rdzv-id="$SLURM_JOB_ID" --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2 --shutdown-timeout=120 \
--no-python \\
    {python} {worker} "$SLURM_SUBMIT_DIR"
"""


def _poll(what, predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _submit(cluster, tmp_path, env, run):
    profile = tmp_path / "testbed.toml"
    profile.write_text(PROFILE.format(visibility="gpus-per-node"))
    config = tmp_path / "job.toml"
    config.write_text(JOB.format(profile=profile, command=json.dumps(["python", str(WORKER), str(run)])))
    r = _exatrain(cluster, "submit", "-c", str(config), f"--run.dir={run}", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.split("submitted job ")[1].split()[0]


def test_c227ac3_torchrun_line_dies_on_torch_24(slurm_cluster, tmp_path):
    env = make_overlay(tmp_path / "torch24", "2.4.0")
    script = tmp_path / "old.sbatch"
    script.write_text(C227AC3_JOB.format(python=sys.executable, worker=WORKER))
    job = slurm_cluster.sbatch(script, "--job-name=c227ac3", cwd=tmp_path, env=env)
    assert slurm_cluster.wait(job, timeout=300) == "FAILED"
    out = (tmp_path / f"c227ac3-{job}.out").read_text()
    assert "torchrun: error: unrecognized arguments: --signals-to-handle=" in out, out


def test_usr2_checkpoint_requeue_on_torch_24(slurm_cluster, tmp_path):
    env = make_overlay(tmp_path / "torch24", "2.4.0")
    run = tmp_path / "runs" / "t24"
    job = _submit(slurm_cluster, tmp_path, env, run)
    try:
        launch = (tmp_path / "runs" / "t24.sbatch").read_text().split("\nsrun --ntasks-per-node=1 ")[-1]
        assert (
            "exatrain.launch.agent --handle-signals=SIGUSR2" in launch and "--signals-to-handle" not in launch
        )
        _poll("4 workers ready", lambda: all((run / f"ready-{r}").is_file() for r in range(4)), 300)
        assert slurm_cluster.run(["scancel", "-s", "USR2", job]).returncode == 0
        _poll("the job to be requeued (PENDING)", lambda: slurm_cluster.state(job) == "PENDING", 180)
        slurm_cluster.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=True)
        assert slurm_cluster.wait(job, timeout=300) == "COMPLETED"
    finally:
        slurm_cluster.run(["scancel", job])

    out = (tmp_path / "runs" / f"exatrain-{job}.out").read_text()
    assert out.count("exatrain: the agent received SIGUSR2: passed it to workers") == 2, (
        out
    )  # one agent per node
    for rank in range(4):  # every worker got the signal and ended after its checkpoint
        assert (run / f"got-{rank}").is_file() and (run / f"done-{rank}").is_file(), out
        assert f"worker {rank}: resumed" in out, out
    assert slurm_cluster.job_info(job)[0].get("Restarts") == "1"
    assert "unrecognized arguments" not in out and not (run / "requeue-requested").exists()


def test_a_torch_older_than_the_floor_fails_the_job_at_start(slurm_cluster, tmp_path):
    env = make_overlay(tmp_path / "torch23", "2.3.1")
    run = tmp_path / "runs" / "t23"
    job = _submit(slurm_cluster, tmp_path, env, run)
    try:
        assert slurm_cluster.wait(job, timeout=300) == "FAILED"
    finally:
        slurm_cluster.run(["scancel", job])
    out = (tmp_path / "runs" / f"exatrain-{job}.out").read_text()
    assert "torch 2.3.1 (of " in out and "is older than exatrain's floor 2.4" in out, out
    assert "HINT: use torch>=2.4" in out, out
    assert not list(run.glob("ready-*"))
