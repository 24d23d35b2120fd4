"""A run directory used again, as a new user does it: every committed checkpoint is announced, a complete
run resumed says so and how to continue, and a fresh run on top of another run's checkpoints is refused."""

import pytest

pytestmark = pytest.mark.e2e

TINY = [
    "--nproc",
    "1",
    "--train.steps=4",
    "--checkpoint.interval=2",
    "--train.eval_at_start=false",
    "--train.eval_batches=2",
    "--train.log_every=2",
    "--run.dir=run",
]


def test_commits_announced_complete_run_explained_fresh_start_refused(exatrain_cli, tmp_path):
    first = exatrain_cli("train", *TINY)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    for step in (2, 4):
        assert f"checkpoint run/checkpoints/step-{step} committed" in first.stdout, first.stdout[-2000:]

    again = exatrain_cli("train", *TINY, "--checkpoint.resume=auto")
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "the run is already complete" in again.stdout and "--train.steps=6" in again.stdout
    done = [line for line in again.stdout.splitlines() if line.startswith("done: ")]
    assert done and done[0].startswith("done: nothing trained (the run was already complete at step 4)"), done
    assert "tok/s" not in again.stdout, again.stdout[-2000:]  # no throughput of a run that did not train

    fresh = exatrain_cli("train", *TINY)
    assert fresh.returncode == 2, fresh.stdout[-2000:] + fresh.stderr[-2000:]
    out = fresh.stdout + fresh.stderr
    assert "already holds checkpoints" in out and "step-4" in out and "HINT:" in out
    assert "--checkpoint.resume=auto" in out and "Traceback" not in out
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*")) == ["step-2", "step-4"]
