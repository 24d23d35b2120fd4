"""Elastic restarts under torchrun's real agent: kill -9 a worker mid-training, the agent restarts the group,
which resumes from the latest committed checkpoint and finishes like an uninterrupted run.

Parity tolerance: 1e-5 absolute on every loss after the resume (same world size and data order, so the
losses are expected to be bit-identical; the tolerance only guards against summation-order noise).
"""

import json
import os
import re
import signal

import pytest

from tests.conftest import finish, run_exatrain, started_exatrain, wait_for, worker_pid
from tests.distributed.helpers import batch_digests, train_losses, train_records

pytestmark = pytest.mark.dist

STEPS, INTERVAL, KILL_AFTER = 80, 10, 15
ARGS = [
    f"--train.steps={STEPS}",
    "--train.log_every=1",
    "--train.eval_every=0",
    "--train.eval_at_start=false",
    "--train.eval_batches=2",
    "--train.global_batch_size=16",
    "--train.micro_batch_size=4",
    "--train.warmup_steps=2",
    "--data.seq_len=32",
    f"--checkpoint.interval={INTERVAL}",
    "--checkpoint.keep=2",
]


def _last_step(run_dir) -> int:
    """The newest step rank 0 has logged (0 before the first; tolerates a line being written right now)."""
    path = run_dir / "metrics.jsonl"
    steps = [0]
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            steps.append(json.loads(line)["step"])
        except (ValueError, KeyError):
            pass
    return max(steps)


def test_killed_worker_is_restarted_and_the_run_finishes_like_an_uninterrupted_one(tmp_path):
    full = run_exatrain(["train", "--nproc=2", f"--run.dir={tmp_path / 'full'}", *ARGS], cwd=tmp_path)
    assert full.returncode == 0, full.stdout + full.stderr

    run = tmp_path / "elastic"
    with started_exatrain(
        ["train", "--nproc=2", "--max-restarts=1", f"--run.dir={run}", *ARGS], cwd=tmp_path
    ) as proc:
        # generous: workers import torch and join first; on a loaded 2-core machine that alone took minutes
        wait_for(lambda: _last_step(run) >= KILL_AFTER, 420, f"step {KILL_AFTER}", proc)
        victim = worker_pid(proc.pid, rank=1)
        assert victim is not None, "no worker with RANK=1 below the launcher"
        os.kill(victim, signal.SIGKILL)
        code, out, err = finish(proc)
        assert code == 0, out + err

    # the first group logged up to the kill, the restarted one names the checkpoint it resumed from
    before, resumed_line, _ = re.split(r"^(resumed from .*)$", out, maxsplit=1, flags=re.M)
    killed_at = max(int(s) for s in re.findall(r"^step +(\d+)/", before, flags=re.M))
    resumed_at = int(re.search(r"at step (\d+)", resumed_line).group(1))
    assert f"step-{resumed_at} " in resumed_line and resumed_at % INTERVAL == 0, resumed_line
    assert KILL_AFTER <= killed_at < STEPS, "the kill must land mid-training"
    assert 0 <= killed_at - resumed_at <= INTERVAL, "no more than one checkpoint interval is recomputed"
    assert json.loads((run / "ranks" / "rank-0.json").read_text())["restart_count"] == 1

    # the restarted group cut metrics.jsonl back to its checkpoint: every step once, in order
    assert [m["step"] for m in train_records(run)] == list(range(1, STEPS + 1))
    expected, got = train_losses(tmp_path / "full"), train_losses(run)
    assert batch_digests(run) == batch_digests(tmp_path / "full"), (
        "a sample skipped or repeated across the restart"
    )
    assert max(abs(expected[s] - got[s]) for s in got) <= 1e-5, (expected, got)
    assert json.loads((run / "summary.json").read_text())["weights_in_sync"]
