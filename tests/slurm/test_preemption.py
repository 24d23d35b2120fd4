"""Pre-timeout signal on a real SLURM job: checkpoint, `scontrol requeue`, rescheduled, resumed, same result.

The signal is delivered with `scancel -s USR2` (what `--signal=USR2@N` does near the time limit, but
deterministic): the first run's ranks wait at the top of step HOLD_AT (HOLD below: a `sitecustomize.py` on
their PYTHONPATH wraps `exatrain.step`, the trainer's progress mark; the trainer is unchanged) until the test
has sent the signal, so the checkpoint comes at step HOLD_AT or the next one however fast the machine is (a
fixed step count against a polled signal raced a fast machine to the end of training). Requeued jobs are
held ~2 minutes by SLURM (EligibleTime): the test releases it with
`scontrol update StartTime=now` as soon as it is PENDING. Reference: the same training uninterrupted on
4 local gloo ranks, compared step by step in every job (`_same_steps_as_reference`): each step once and in
order, the same global batch (batch digests) and a loss within 1e-5 at every step, and the final eval loss.
"""

import json
import sys
import time
from pathlib import Path

import pytest

from exatrain.observe import read_metrics
from tests.conftest import run_exatrain

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slurm

STEPS = 40
HOLD_AT = 10  # the first run's ranks wait at the top of this step until the signal was sent
HOLD = f"""import os, time
from pathlib import Path

GO = os.environ.get("EXATRAIN_TEST_GO_FILE")
if GO and os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
    import exatrain.observe.heartbeat as heartbeat

    _mark = heartbeat.step

    def step(n=None):
        done = _mark(n)
        deadline = time.monotonic() + 300
        while n == {HOLD_AT} and not Path(GO).exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # the signal's handler runs in this thread meanwhile
        return done

    heartbeat.step = step
"""


def _hold(tmp_path) -> tuple[dict[str, str], Path]:
    """The environment that makes the first run's ranks wait at step HOLD_AT; the file that releases them."""
    folder = tmp_path / "hold"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(HOLD)
    go = tmp_path / "go"
    return {"PYTHONPATH": f"{folder}:{ROOT}", "EXATRAIN_TEST_GO_FILE": str(go)}, go


def _signal_at_the_hold(cluster, job: str, metrics: Path, go: Path) -> None:
    """Once the ranks logged step HOLD_AT - 1 (they then wait at the top of HOLD_AT): USR2, then release."""
    _poll(f"training to reach step {HOLD_AT - 1}", lambda: _last_step(metrics) >= HOLD_AT - 1, 300)
    assert cluster.run(["scancel", "-s", "USR2", job]).returncode == 0
    time.sleep(1)  # slurmstepd delivers it to every rank (not a timing assertion: the ranks wait for `go`)
    go.touch()


ARGS = [
    f"--train.steps={STEPS}",
    "--train.log_every=1",
    "--train.eval_every=0",
    "--train.eval_batches=4",
    "--train.eval_at_start=false",
    "--train.global_batch_size=32",
    "--train.micro_batch_size=8",
    "--data.seq_len=64",
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The metrics of the same training uninterrupted, `exatrain train --nproc=4` here (the two jobs below
    both train ARGS' run: one reference serves them)."""
    ref = tmp_path_factory.mktemp("preemption") / "reference"
    r = run_exatrain(["train", "--nproc=4", f"--run.dir={ref}", *ARGS], cwd=ref.parent)
    assert r.returncode == 0, r.stderr
    return read_metrics(ref / "metrics.jsonl")


JOB = """#!/bin/bash
#SBATCH --job-name=exatrain-requeue
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --time=00:10:00
#SBATCH --output=%x-%j.out
#SBATCH --open-mode=append
export OMP_NUM_THREADS=1 PYTHONPATH={pythonpath} EXATRAIN_TEST_GO_FILE={go}
echo "start restarts=${{SLURM_RESTART_COUNT:-0}}"
srun --kill-on-bad-exit=1 {python} -m exatrain.cli.main train --run.dir="$SLURM_SUBMIT_DIR/run" \\
  --checkpoint.resume=auto {args}
"""


def _poll(what, predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _last_step(path):
    try:
        return max((m["step"] for m in read_metrics(path) if m["kind"] == "train"), default=0)
    except (OSError, ValueError):
        return 0


def _same_steps_as_reference(got: list[dict], reference: list[dict]) -> None:
    """The interrupted job's training records against the uninterrupted run's, step by step: every step
    recorded exactly once and in order (a list, so a step repeated after the resume is seen), the same global
    batch at every step (batch digests: none skipped or read twice across the requeue) and every step's loss
    within 1e-5, the final eval loss too."""
    records = [m for m in got if m["kind"] == "train"]
    want = [m for m in reference if m["kind"] == "train"]
    assert [m["step"] for m in records] == list(range(1, STEPS + 1)), "every step exactly once, in order"
    assert [m["step"] for m in want] == list(range(1, STEPS + 1))
    assert [m["batch_digest"] for m in records] == [m["batch_digest"] for m in want], (
        "a global batch skipped or repeated across the requeue"
    )
    far = [
        (g["step"], g["loss"], w["loss"]) for g, w in zip(records, want) if abs(g["loss"] - w["loss"]) > 1e-5
    ]
    assert not far, f"(step, loss, uninterrupted loss) beyond 1e-5: {far}"
    final_got = [m for m in got if m["kind"] == "eval"][-1]["loss"]
    final_want = [m for m in reference if m["kind"] == "eval"][-1]["loss"]
    assert abs(final_got - final_want) <= 1e-5


def test_signal_checkpoint_requeue_resume(slurm_cluster, reference, tmp_path):
    script = tmp_path / "job.sbatch"
    env, go = _hold(tmp_path)
    text = JOB.format(python=sys.executable, args=" ".join(ARGS), pythonpath=env["PYTHONPATH"], go=go)
    script.write_text(text)
    job = slurm_cluster.sbatch(script, cwd=tmp_path)
    metrics = tmp_path / "run" / "metrics.jsonl"
    _signal_at_the_hold(slurm_cluster, job, metrics, go)
    _poll("the job to be requeued (PENDING)", lambda: slurm_cluster.state(job) == "PENDING", 120)
    slurm_cluster.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=True)
    assert slurm_cluster.wait(job, timeout=600) == "COMPLETED"

    out = (tmp_path / f"exatrain-requeue-{job}.out").read_text()
    assert "start restarts=0" in out and "start restarts=1" in out, out
    assert "signal SIGUSR2: checkpointing at step" in out and "requeueing SLURM job" in out, out
    assert "DUE TO JOB REQUEUE" in out, out
    assert "resumed from" in out, out
    ckpt_step = int(out.split("checkpointing at step ")[1].split()[0])
    assert HOLD_AT <= ckpt_step <= HOLD_AT + 1, ckpt_step  # the step the ranks were held at, or the next

    _same_steps_as_reference(read_metrics(metrics), reference)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["weights_in_sync"]


# what both SLURM jobs of this file train (the [job] sections differ)
TRAIN_TAIL = """[job.env]
OMP_NUM_THREADS = "1"
[train]
steps = {steps}
log_every = 1
eval_every = 0
eval_batches = 4
eval_at_start = false
global_batch_size = 32
micro_batch_size = 8
[data]
seq_len = 64
"""
# torchrun mode (exatrain submit's own script, the agent forwarding the signal): every site twin runs it in
# tests/slurm/test_twin_training.py, compared step by step with the same uninterrupted-run checks.


SRUN_JOB = (
    """[job]
nodes = 2
time = 10
profile = "{profile}"
launch = "srun"
signal = "USR2@60"
command = {command}
"""
    + TRAIN_TAIL
)


def test_srun_mode_ranks_without_scontrol_exit_75_and_the_batch_script_requeues(
    slurm_cluster, reference, tmp_path
):
    """exatrain's own srun-mode script, unedited; the ranks run with PATH holding only the venv's bin (as in a
    container without SLURM's tools), the batch shell keeps its PATH. On USR2 every rank finishes its step,
    rank 0 checkpoints, finds no scontrol and every rank exits 75; the batch script sees 75 and requeues; the
    requeued job resumes and ends like the uninterrupted reference."""
    from tests.slurm.test_submit import PROFILE, _exatrain

    profile = tmp_path / "testbed.toml"
    profile.write_text(PROFILE.format(visibility="gpus-per-task"))
    run = tmp_path / "runs" / "nosc"
    venv_bin = Path(sys.executable).parent
    assert not (venv_bin / "scontrol").exists()
    rank = [
        "env",
        f"PATH={venv_bin}",
        sys.executable,
        "-m",
        "exatrain.cli.main",
        "train",
        f"--config={run.parent / 'nosc.toml'}",
        f"--run.dir={run}",
    ]
    config = tmp_path / "job.toml"
    config.write_text(SRUN_JOB.format(profile=profile, command=json.dumps(rank), steps=STEPS))
    env, go = _hold(tmp_path)
    r = _exatrain(
        slurm_cluster,
        "submit",
        "-c",
        str(config),
        f"--run.dir={run}",
        "--train.device=cpu",
        cwd=tmp_path,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    job = r.stdout.split("submitted job ")[1].split()[0]
    _signal_at_the_hold(slurm_cluster, job, run / "metrics.jsonl", go)
    _poll("the job to be requeued (PENDING)", lambda: slurm_cluster.state(job) == "PENDING", 180)
    slurm_cluster.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=True)
    assert slurm_cluster.wait(job, timeout=600) == "COMPLETED"

    out = (tmp_path / "runs" / f"exatrain-{job}.out").read_text()
    assert out.count(f"exatrain job {job} ") == 2, out  # the batch script ran twice: requeued once
    assert slurm_cluster.job_info(job)[0].get("Restarts") == "1"
    assert "signal SIGUSR2: checkpointing at step" in out, out
    assert HOLD_AT <= int(out.split("checkpointing at step ")[1].split()[0]) <= HOLD_AT + 1, out
    assert "scontrol not found" in out and "(exit code 75)" in out, out  # the ranks could not requeue
    assert "resumed from" in out, out
    assert not (run / "requeue-requested").exists()

    _same_steps_as_reference(read_metrics(run / "metrics.jsonl"), reference)
