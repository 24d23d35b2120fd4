"""The pre-timeout signal on a local `exatrain train --nproc 2` run (torchrun's elastic agent, real gloo
workers): the signal sent to exatrain reaches the workers through the agent (--signals-to-handle), every rank
finishes its step, the checkpoint is committed, the run exits 75 ("checkpointed, continue"), and the resumed
run ends exactly like an uninterrupted one (same world size: same data, same sums, generators continue)."""

import os
import signal

import pytest

from exatrain.observe import read_metrics
from tests.conftest import finish, run_exatrain, started_exatrain, wait_for
from tests.distributed.helpers import train_losses

pytestmark = pytest.mark.dist

ARGS = [
    "--train.steps=60",
    "--train.log_every=1",
    "--train.eval_every=0",
    "--train.eval_at_start=false",
    "--train.eval_batches=2",
    "--train.global_batch_size=8",
    "--train.micro_batch_size=4",
    "--train.warmup_steps=2",
    "--data.seq_len=16",
    "--train.save_model=false",
]


def _step(run):
    try:
        return max(
            (m["step"] for m in read_metrics(run / "metrics.jsonl") if m["kind"] == "train"), default=0
        )
    except (OSError, ValueError):
        return 0


def test_usr2_checkpoints_exits_75_and_the_resumed_run_matches(tmp_path):
    run = tmp_path / "run"
    with started_exatrain(["train", "--nproc=2", f"--run.dir={run}", *ARGS], cwd=tmp_path) as proc:
        wait_for(lambda: _step(run) >= 3, 300, "step 3", proc)
        os.kill(proc.pid, signal.SIGUSR2)
        code, out, err = finish(proc)
    assert code == 75, out + err
    assert "signal SIGUSR2: checkpointing at step" in out and "committed" in out, out + err
    assert "continue with --checkpoint.resume=auto" in err, err
    assert not (run / "requeue-requested").exists()  # acted on, then removed
    step = int(out.split("checkpointing at step ")[1].split()[0])
    assert 3 <= step < 60

    resumed = run_exatrain(
        ["train", "--nproc=2", f"--run.dir={run}", "--checkpoint.resume=auto", *ARGS], cwd=tmp_path
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from" in resumed.stdout
    reference = tmp_path / "reference"
    full = run_exatrain(["train", "--nproc=2", f"--run.dir={reference}", *ARGS], cwd=tmp_path)
    assert full.returncode == 0, full.stderr
    got, want = train_losses(run), train_losses(reference)
    assert sorted(got) == list(range(1, 61))
    assert got[60] == want[60]
