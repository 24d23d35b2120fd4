"""The reference trainer's hang recovery under torchrun's agent (issue 25, docs/hangs.md): 4 gloo ranks of
`exatrain train --nproc 4 --max-restarts 1 --run.hang_timeout_s=30`, rank 2 stalls in step 7 of the first
attempt; the watcher names rank 2 and the line of the stall, every rank exits with code 76, the agent restarts
the group, the trainer resumes from its step-5 checkpoint and ends like the same training uninterrupted: every
step logged once, each step's loss within 1e-5 and its global-batch digest equal, the final evaluation within
1e-5.

The stall is injected without touching the trainer: a `sitecustomize.py` on the workers' PYTHONPATH (Python
imports it at start) wraps `exatrain.step`, the progress mark the trainer makes at the top of every step, so
that rank 2 of attempt 0 sleeps right after marking step 7 (what a rank stuck in its data loader looks like to
the others). What it does not reproduce: a stall inside torch or a device (those are the user-loop tests of
test_hangs.py: SIGSTOP and a collective nobody else enters)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from exatrain.errors import EXIT_HANG
from exatrain.observe import read_metrics
from tests.conftest import clean_environment

pytestmark = pytest.mark.dist

STALL_STEP = 7
SITECUSTOMIZE = f"""import os
import time

if os.environ.get("RANK") == "2" and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
    import exatrain.observe.heartbeat as heartbeat

    _mark = heartbeat.step

    def step(n=None):
        done = _mark(n)
        if n == {STALL_STEP}:
            time.sleep(3600)  # STALL-LINE
        return done

    heartbeat.step = step
"""
ARGS = [
    "--train.steps=12",
    "--train.log_every=1",
    "--train.eval_every=0",
    "--train.eval_batches=2",
    "--train.eval_at_start=false",
    "--train.global_batch_size=16",
    "--train.micro_batch_size=4",
    "--data.seq_len=16",
    "--checkpoint.interval=5",
]


def _train(tmp_path, name: str, extra_env: dict | None = None, options: tuple[str, ...] = ()):
    run = tmp_path / name
    cmd = [
        sys.executable,
        "-m",
        "exatrain.cli.main",
        "train",
        "--nproc=4",
        *options,
        f"--run.dir={run}",
        *ARGS,
    ]
    env = clean_environment({"OMP_NUM_THREADS": "1", **(extra_env or {})})
    return subprocess.Popen(
        cmd, cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def test_a_hung_rank_restarts_the_trainer_from_its_checkpoint_and_it_ends_as_uninterrupted(tmp_path):
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(SITECUSTOMIZE)
    # 30 s: well above a step of this tiny model on a loaded 2-core machine, its first one included
    hung = _train(
        tmp_path, "hung", {"PYTHONPATH": str(inject)}, ("--max-restarts=1", "--run.hang_timeout_s=30")
    )
    plain = _train(tmp_path, "plain", options=("--run.hang_timeout_s=0",))  # uninterrupted, side by side
    try:
        out, err = hung.communicate(timeout=600)
        ref_out, ref_err = plain.communicate(timeout=600)
    finally:
        hung.kill()
        plain.kill()
    assert plain.returncode == 0, ref_out[-2000:] + ref_err[-3000:]
    assert hung.returncode == 0, out[-2000:] + err[-4000:]

    diagnosis = (tmp_path / "hung" / "hang" / "attempt-0" / "diagnosis.txt").read_text()
    line = next(i for i, t in enumerate(SITECUSTOMIZE.splitlines(), 1) if "STALL-LINE" in t)
    assert "rank 2 (" in diagnosis and f"at step {STALL_STEP} " in diagnosis, diagnosis
    assert f"sitecustomize.py:{line} " in diagnosis.split(";")[0], diagnosis
    assert f"exit with code {EXIT_HANG}" in diagnosis
    assert "resumed from" in out + err and "at step 5" in out + err, (out + err)[-3000:]

    got, want = (read_metrics(tmp_path / n / "metrics.jsonl") for n in ("hung", "plain"))
    train, ref = ([m for m in ms if m["kind"] == "train"] for ms in (got, want))
    assert [m["step"] for m in train] == list(range(1, 13)), "every step exactly once, in order"
    assert [m["batch_digest"] for m in train] == [m["batch_digest"] for m in ref]
    far = [(g["step"], g["loss"], w["loss"]) for g, w in zip(train, ref) if abs(g["loss"] - w["loss"]) > 1e-5]
    assert not far, f"(step, loss, uninterrupted loss) beyond 1e-5: {far}"
    final = [[m for m in ms if m["kind"] == "eval"][-1]["loss"] for ms in (got, want)]
    assert abs(final[0] - final[1]) <= 1e-5
    summary = json.loads((tmp_path / "hung" / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["weights_in_sync"]
