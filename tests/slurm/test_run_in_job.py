"""`exatrain run` in a real SLURM job, as docs/own-code.md describes it: in the batch shell (no job step) and
in an salloc shell it refuses with a HINT instead of running a world of one; as a task of a real `srun` step
it becomes the script (the same PID: the script's parent is SLURM's slurmstepd), so a signal sent with
`scancel` reaches the script's own handler, and the script's exit code is the task's (srun reports it).
tests/e2e/test_run.py checks the same with srun's variables written by hand; here slurmctld, slurmd, srun,
salloc and scancel are the real ones."""

import json
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

EXATRAIN = Path(sys.executable).parent / "exatrain"  # the venv's console script, as a user calls it
# Records that it ran; never reached where exatrain refuses.
RAN = "import pathlib, sys\npathlib.Path(sys.argv[1]).write_text('ran')\n"
REFUSAL = "batch shell, not a job step: the script would run as one process"


def _refused(text: str, job: str) -> None:
    assert f"exatrain: error: inside SLURM job {job}'s batch shell, not a job step" in text, text
    hint = text.split("HINT: ", 1)[1]
    assert "srun exatrain run train.py" in hint and "--nproc N" in hint, text
    assert "Traceback" not in text


def test_batch_shell_is_refused_with_a_hint(slurm_cluster, tmp_path):
    """`exatrain run` written straight into a batch script (no srun) of a 2-task job: exit code 2, the
    refusal with its HINT in the job's output, and the script never ran."""
    (tmp_path / "ran.py").write_text(RAN)
    (tmp_path / "job.sh").write_text(
        "#!/bin/bash\n#SBATCH --ntasks=2\n#SBATCH --time=2\n#SBATCH --output=out-%j.txt\n"
        f'{EXATRAIN} run ran.py "$SLURM_SUBMIT_DIR/marker"\necho "exatrain run exited $?"\n'
    )
    job = slurm_cluster.sbatch(tmp_path / "job.sh", cwd=tmp_path)
    assert slurm_cluster.wait(job, timeout=120) == "COMPLETED"  # the batch script's own last echo
    out = (tmp_path / f"out-{job}.txt").read_text()
    _refused(out, job)
    assert "exatrain run exited 2" in out, out
    assert not (tmp_path / "marker").exists()


def test_salloc_shell_is_refused_with_a_hint(slurm_cluster, tmp_path):
    """The same from the command salloc runs in its allocation (on the submit host, no job step)."""
    (tmp_path / "ran.py").write_text(RAN)
    r = slurm_cluster.run(
        ["salloc", "--ntasks=2", "--time=2", str(EXATRAIN), "run", "ran.py", str(tmp_path / "marker")],
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    job = r.stderr.split("Granted job allocation ")[1].split()[0]
    _refused(r.stderr, job)
    assert not (tmp_path / "marker").exists()


# Each rank: handles SIGUSR2, says who its parent is, waits for the signal, exits 0 (rank 0) or 7 (rank 1)
# from the handler; 3 if no signal came within 100 s.
WAITER = """import json, os, pathlib, signal, sys, time
out, rank = pathlib.Path(sys.argv[1]), os.environ["RANK"]

def handler(signum, frame):
    (out / f"signal-{rank}").write_text(json.dumps({"signal": signal.Signals(signum).name, \
"pid": os.getpid()}))
    sys.exit(7 if rank == "1" else 0)

signal.signal(signal.SIGUSR2, handler)
with open(f"/proc/{os.getppid()}/comm") as f:
    parent = f.read().strip()
info = {"pid": os.getpid(), "parent": parent, "procid": os.environ["SLURM_PROCID"], \
"world": os.environ["WORLD_SIZE"]}
(out / f"ready-{rank}").write_text(json.dumps(info))
time.sleep(100)
sys.exit(3)
"""


def _poll(what, predicate, timeout):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_scancel_signal_reaches_the_script_through_exatrain_run(slurm_cluster, tmp_path):
    """`srun exatrain run waiter.py` over 2 nodes; `scancel --signal=USR2` (what `--signal=USR2@N` sends
    before the time limit) reaches each rank's handler; rank 1's exit code 7 is its task's, as srun
    reports."""
    (tmp_path / "waiter.py").write_text(WAITER)
    (tmp_path / "job.sh").write_text(
        "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --time=3\n"
        "#SBATCH --signal=USR2@60\n#SBATCH --output=out-%j.txt\n"
        f'srun {EXATRAIN} run waiter.py "$SLURM_SUBMIT_DIR"\necho "srun exited $?"\n'
    )
    job = slurm_cluster.sbatch(tmp_path / "job.sh", cwd=tmp_path)
    ready = [tmp_path / f"ready-{rank}" for rank in (0, 1)]
    _poll("both ranks to install their handler", lambda: all(p.exists() for p in ready), 120)
    assert slurm_cluster.run(["scancel", "--signal=USR2", job]).returncode == 0
    assert slurm_cluster.wait(job, timeout=120) == "COMPLETED"
    out = (tmp_path / f"out-{job}.txt").read_text()

    infos = [json.loads(p.read_text()) for p in ready]
    assert [(i["procid"], i["world"]) for i in infos] == [("0", "2"), ("1", "2")]
    assert [i["parent"] for i in infos] == ["slurmstepd", "slurmstepd"], (
        "exatrain run did not become the task"
    )
    got = [json.loads((tmp_path / f"signal-{rank}").read_text()) for rank in (0, 1)]
    assert [g["signal"] for g in got] == ["SIGUSR2", "SIGUSR2"], out
    assert [g["pid"] for g in got] == [i["pid"] for i in infos]
    assert "task 1: Exited with exit code 7" in out and "srun exited 7" in out, out


# Each rank prints one line in three writes (print's arguments under `python -u`).
TALKER = 'import os\nprint("hello from", os.environ["RANK"], "of", os.environ["WORLD_SIZE"])\n'
LABEL_JOB = """[job]
nodes = 2
time = 5
profile = "{profile}"
launch = "{launch}"
label = true
command = ["python", "{script}"]
signal = ""
[job.env]
OMP_NUM_THREADS = "1"
"""


@pytest.mark.parametrize("launch", ["srun", "torchrun"])
def test_job_label_begins_each_rank_line_with_its_rank(slurm_cluster, tmp_path, launch):
    """`[job] label = true` with `exatrain submit` (docs/output.md): in the job's log each of the 4 ranks'
    lines is whole and begins with `[rank N] `, N its global rank."""
    from tests.slurm.test_submit import PROFILE, _exatrain

    profile = tmp_path / "testbed.toml"
    profile.write_text(PROFILE.format(visibility="gpus-per-node"))
    (tmp_path / "talker.py").write_text(TALKER)
    config = tmp_path / "job.toml"
    config.write_text(LABEL_JOB.format(profile=profile, launch=launch, script=tmp_path / "talker.py"))
    r = _exatrain(
        slurm_cluster, "submit", "-c", str(config), f"--run.dir={tmp_path / 'runs' / 'l'}", cwd=tmp_path
    )
    assert r.returncode == 0, r.stdout + r.stderr
    job = r.stdout.split("submitted job ")[1].split()[0]
    state = slurm_cluster.wait(job, timeout=180)
    log = (tmp_path / "runs" / f"exatrain-{job}.out").read_text()
    assert state == "COMPLETED", log
    lines = [line for line in log.splitlines() if "hello from" in line]
    assert sorted(lines) == [f"[rank {r}] hello from {r} of 4" for r in range(4)], log
