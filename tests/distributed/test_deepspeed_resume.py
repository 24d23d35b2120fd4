"""[engine] name = "deepspeed" (ZeRO-2, DeepSpeed's CPU accelerator, real gloo workers under `exatrain train
--nproc`): the pre-timeout signal path, and resuming at another world size through DeepSpeed's universal
checkpoint.

One uninterrupted 2-rank run is the reference for both. fp32, dropout 0, gradient accumulation and clipping
active. Resuming at the same world size must reproduce it exactly (the same shards, the same sums). At another
world size the gradient sums run in another order (one rank accumulating 4 micro-batches instead of 2 ranks
accumulating 2 each), so the losses must agree within the engines' tolerance, 1e-5 absolute per step (as ZeRO
against DDP in test_deepspeed_engine.py).
"""

import json
import os
import shutil
import signal

import pytest

from exatrain.observe import read_metrics
from tests.conftest import finish, run_exatrain, started_exatrain, wait_for
from tests.distributed.cli_runs import max_diff
from tests.distributed.helpers import train_losses

pytestmark = pytest.mark.dist

STEPS = 16
ARGS = [
    f"--train.steps={STEPS}",
    "--train.log_every=1",
    "--train.eval_every=0",
    "--train.eval_at_start=false",
    "--train.eval_batches=2",
    "--train.global_batch_size=16",
    "--train.micro_batch_size=4",
    "--train.warmup_steps=2",
    "--train.grad_clip=0.5",
    "--data.seq_len=32",
    "--train.save_model=false",
    "--engine.name=deepspeed",
    "--engine.zero_stage=2",
]
TOL = 1e-5


def _train(tmp, run, nproc, *extra):
    r = run_exatrain(["train", f"--nproc={nproc}", f"--run.dir={run}", *ARGS, *extra], cwd=tmp)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return r


def _step(run):
    try:
        return max(
            (m["step"] for m in read_metrics(run / "metrics.jsonl") if m["kind"] == "train"), default=0
        )
    except (OSError, ValueError):
        return 0


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """{step: loss} of the uninterrupted 2-rank run."""
    tmp = tmp_path_factory.mktemp("ds-reference")
    _train(tmp, tmp / "run", 2)
    losses = train_losses(tmp / "run")
    assert sorted(losses) == list(range(1, STEPS + 1))
    return losses


@pytest.fixture(scope="module")
def signalled(tmp_path_factory):
    """A 2-rank run sent SIGUSR2 after step 3: (run dir, step it checkpointed at, exit code, stdout,
    stderr)."""
    tmp = tmp_path_factory.mktemp("ds-signal")
    run = tmp / "run"
    with started_exatrain(["train", "--nproc=2", f"--run.dir={run}", *ARGS], cwd=tmp) as proc:
        wait_for(lambda: _step(run) >= 3, 300, "step 3", proc)
        os.kill(proc.pid, signal.SIGUSR2)
        code, out, err = finish(proc)
    step = int(out.split("checkpointing at step ")[1].split()[0]) if "checkpointing at step " in out else -1
    return run, step, code, out, err


def test_signal_checkpoints_exits_75_and_the_resumed_run_equals_the_uninterrupted_one(
    signalled, reference, tmp_path
):
    run, step, code, out, err = signalled
    assert code == 75, out + err
    assert (
        "signal SIGUSR2: checkpointing at step" in out
        and f"checkpoint {run / 'checkpoints' / f'step-{step}'} committed" in out
    ), out
    assert "continue with --checkpoint.resume=auto" in err, err
    assert 3 <= step < STEPS
    info = json.loads((run / "checkpoints" / f"step-{step}" / "exatrain.json").read_text())
    assert info == {"step": step, "world_size": 2, "zero_stage": 2}
    shards = sorted(
        p.name for p in (run / "checkpoints" / f"step-{step}" / "deepspeed").glob("*optim_states.pt")
    )
    assert len(shards) == 2, shards  # every rank wrote its ZeRO-2 partition
    assert sorted(train_losses(run)) == list(range(1, step + 1))  # every rank finished the step it was in

    resumed = _train(tmp_path, run, 2, "--checkpoint.resume=auto")
    assert f"at step {step}" in resumed.stdout and "resumed from" in resumed.stdout, resumed.stdout
    got = train_losses(run)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert got == reference  # exactly: same world size, same shards, same sums


def test_resume_at_another_world_size_through_the_universal_checkpoint(signalled, reference, tmp_path):
    """2 -> 1 -> 2 ranks: the signalled run's 2-rank checkpoint continues on 1 rank (converted once into
    step-N/universal), that run's own 1-rank checkpoint continues on 2 ranks; each matches the reference."""
    source, step = signalled[0] / "checkpoints" / f"step-{signalled[1]}", signalled[1]
    one = tmp_path / "one"
    shutil.copytree(source, one / "checkpoints" / source.name)
    stale = one / "checkpoints" / source.name / ".universal.partial" / "deepspeed"
    stale.mkdir(parents=True)  # what a conversion killed before its rename leaves: replaced, never loaded
    (stale / "latest").write_text("garbage\n")
    r = _train(tmp_path, one, 1, "--checkpoint.resume=auto", "--checkpoint.interval=5", "--checkpoint.keep=0")
    assert f"at step {step}" in r.stdout and "DeepSpeed's universal checkpoint" in r.stdout, r.stdout
    assert (one / "checkpoints" / source.name / "universal" / "deepspeed" / "zero").is_dir()
    assert not (one / "checkpoints" / source.name / ".universal.partial").exists()
    assert not (one / "checkpoints" / source.name / "universal" / "deepspeed" / "latest").exists()
    got = train_losses(one)
    assert sorted(got) == list(range(step + 1, STEPS + 1))
    assert max_diff([got[s] for s in got], [reference[s] for s in got]) <= TOL, (got, reference)

    later = min(
        int(p.name.split("-")[1])
        for p in (one / "checkpoints").glob("step-*")
        if step < int(p.name.split("-")[1]) < STEPS
    )
    assert (
        json.loads((one / "checkpoints" / f"step-{later}" / "exatrain.json").read_text())["world_size"] == 1
    )
    two = tmp_path / "two"
    shutil.copytree(one / "checkpoints" / f"step-{later}", two / "checkpoints" / f"step-{later}")
    r = _train(tmp_path, two, 2, "--checkpoint.resume=auto")
    assert f"at step {later}" in r.stdout, r.stdout
    got = train_losses(two)
    assert sorted(got) == list(range(later + 1, STEPS + 1))
    assert max_diff([got[s] for s in got], [reference[s] for s in got]) <= TOL, (got, reference)


def test_zero1_resumes_at_another_world_size(tmp_path):
    """ZeRO-1 (optimizer state sharded, the other stage the universal checkpoint serves): a 2-rank run's
    step-3 checkpoint continues on 1 rank; steps 4-6 within 1e-5 of the 2-rank run's."""
    args = ["--train.steps=6", "--engine.zero_stage=1", "--checkpoint.interval=3"]
    _train(tmp_path, tmp_path / "full", 2, *args)
    step3 = tmp_path / "one" / "checkpoints" / "step-3"
    shutil.copytree(tmp_path / "full" / "checkpoints" / "step-3", step3)
    assert json.loads((step3 / "exatrain.json").read_text()) == {"step": 3, "world_size": 2, "zero_stage": 1}
    _train(tmp_path, tmp_path / "one", 1, *args, "--checkpoint.resume=auto")
    got, want = train_losses(tmp_path / "one"), train_losses(tmp_path / "full")
    assert sorted(got) == [4, 5, 6]
    assert max_diff([got[s] for s in got], [want[s] for s in got]) <= TOL, (got, want)
