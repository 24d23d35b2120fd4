"""Sharded checkpoints on real gloo groups: resume under another world size, export, damaged input.

Parity tolerance: 1e-5 absolute on every loss after a resume under another world size (only the float
summation order of the gradient all-reduce differs between 2 ranks and 1 rank); exact equality after a resume
under the same world size (same data, same sums, and the random generators continue where they were);
exported weights must be bit-identical to the run's own final.pt.
"""

import os
import shutil
import signal
import time

import pytest
import torch

from exatrain.observe import read_metrics
from tests.conftest import finish, started_exatrain, wait_for, worker_pid
from tests.distributed.helpers import batch_digests, train_losses, train_records

pytestmark = pytest.mark.dist

COMMON = [
    "--train.steps=12",
    "--train.log_every=1",
    "--train.eval_every=0",
    "--train.eval_at_start=false",
    "--train.eval_batches=2",
    "--train.global_batch_size=16",
    "--train.micro_batch_size=4",
    "--train.warmup_steps=2",
    "--data.seq_len=32",
    "--checkpoint.interval=6",
    "--checkpoint.keep=0",
]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """12 steps on 2 ranks with checkpoints at steps 6 and 12."""
    from tests.conftest import run_exatrain

    tmp = tmp_path_factory.mktemp("ckpt")
    run = tmp / "full"
    r = run_exatrain(["train", "--nproc=2", f"--run.dir={run}", *COMMON], cwd=tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    return run


def test_checkpoints_committed_with_marker(uninterrupted):
    names = sorted(p.name for p in (uninterrupted / "checkpoints").iterdir())
    assert names == ["step-12", "step-6"]
    assert all((uninterrupted / "checkpoints" / n / "COMMITTED").is_file() for n in names)


@pytest.mark.parametrize("nproc", [1, 4])
def test_resume_under_other_world_size_continues_identically(uninterrupted, exatrain_cli, tmp_path, nproc):
    run = tmp_path / "resumed"
    shutil.copytree(uninterrupted / "checkpoints" / "step-6", run / "checkpoints" / "step-6")
    r = exatrain_cli(
        "train",
        f"--nproc={nproc}",
        f"--run.dir={run}",
        *COMMON,
        "--checkpoint.resume=auto",
        "--train.micro_batch_size=4",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resumed from" in r.stdout and "at step 6" in r.stdout
    full, resumed = train_losses(uninterrupted), train_losses(run)
    assert sorted(resumed) == list(range(7, 13)), "a resumed run trains exactly the remaining steps"
    assert max(abs(full[s] - resumed[s]) for s in resumed) <= 1e-5, (full, resumed)
    # no sample skipped or repeated: each step consumed the uninterrupted run's global batch
    want = batch_digests(uninterrupted)
    assert len(set(want.values())) == 12 and batch_digests(run) == {s: want[s] for s in range(7, 13)}


def test_export_loads_into_a_plain_model(uninterrupted, exatrain_cli, tmp_path):
    out = tmp_path / "model.pt"
    r = exatrain_cli("checkpoint", "export", str(uninterrupted / "checkpoints" / "step-12"), str(out))
    assert r.returncode == 0, r.stderr
    exported = torch.load(out, weights_only=True)
    final = torch.load(uninterrupted / "final.pt", weights_only=True)
    assert exported.keys() == final.keys()
    assert all(torch.equal(exported[k], final[k]) for k in final)


def test_exported_file_seeds_training(uninterrupted, exatrain_cli, tmp_path):
    r = exatrain_cli(
        "train",
        "--nproc=1",
        f"--run.dir={tmp_path / 'seeded'}",
        "--train.steps=1",
        "--train.eval_batches=2",
        "--data.seq_len=32",
        "--train.global_batch_size=16",
        f"--checkpoint.init_from={uninterrupted / 'final.pt'}",
    )
    assert r.returncode == 0, r.stderr
    r2 = exatrain_cli(
        "train",
        "--nproc=1",
        f"--run.dir={tmp_path / 'fresh'}",
        "--train.steps=1",
        "--train.eval_batches=2",
        "--data.seq_len=32",
        "--train.global_batch_size=16",
    )
    assert r2.returncode == 0, r2.stderr
    seeded = read_metrics(tmp_path / "seeded" / "metrics.jsonl")[0]
    fresh = read_metrics(tmp_path / "fresh" / "metrics.jsonl")[0]
    assert seeded["kind"] == fresh["kind"] == "eval" and seeded["loss"] < fresh["loss"] - 0.2


def test_incomplete_checkpoints_are_ignored_and_removed(uninterrupted, exatrain_cli, tmp_path):
    """The state a rank killed mid-save leaves: a partial folder, and a step folder without its marker."""
    ckpts = tmp_path / "run" / "checkpoints"
    shutil.copytree(uninterrupted / "checkpoints" / "step-6", ckpts / "step-6")
    shutil.copytree(uninterrupted / "checkpoints" / "step-12", ckpts / ".step-9.partial")
    shutil.copytree(uninterrupted / "checkpoints" / "step-12", ckpts / "step-12")
    (ckpts / "step-12" / "COMMITTED").unlink()
    (ckpts / ".step-9.partial" / "COMMITTED").unlink()
    r = exatrain_cli(
        "train",
        "--nproc=1",
        f"--run.dir={tmp_path / 'run'}",
        *COMMON,
        "--checkpoint.resume=auto",
        "--checkpoint.interval=0",
    )
    assert r.returncode == 0, r.stderr
    assert "at step 6" in r.stdout
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-6"]


def _bad(exatrain_cli, tmp_path, *args):
    r = exatrain_cli("train", "--nproc=1", f"--run.dir={tmp_path / 'bad'}", *COMMON, *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "HINT:" in r.stderr and "Traceback" not in r.stderr
    return r.stderr


def test_bad_checkpoint_input(uninterrupted, exatrain_cli, tmp_path):
    assert "no such checkpoint" in _bad(exatrain_cli, tmp_path, f"--checkpoint.resume={tmp_path / 'nope'}")
    damaged = tmp_path / "damaged" / "step-6"
    shutil.copytree(uninterrupted / "checkpoints" / "step-6", damaged)
    (damaged / ".metadata").write_bytes(b"not a pickle")
    assert "metadata" in _bad(exatrain_cli, tmp_path, f"--checkpoint.resume={damaged}")
    err = _bad(
        exatrain_cli,
        tmp_path,
        "--model.size=small",
        f"--checkpoint.resume={uninterrupted / 'checkpoints' / 'step-6'}",
    )
    assert "does not match the model" in err and "shape of" in err
    r = exatrain_cli(
        "checkpoint",
        "export",
        str(uninterrupted / "checkpoints" / "step-6"),
        str(tmp_path / "missing" / "dir" / "model.pt"),
    )
    assert r.returncode == 2 and "does not exist" in r.stderr and "HINT:" in r.stderr


def _contents(ckpt, tmp):
    """Every entry of a checkpoint, flattened: tensors as raw bytes (dtype, shape), objects as they are."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp / f"{ckpt.parent.parent.name}-{ckpt.name}.pt"
    dcp_to_torch_save(str(ckpt), str(out))

    def flat(x, prefix=""):
        if isinstance(x, dict):
            for k, v in x.items():
                yield from flat(v, f"{prefix}.{k}")
        elif isinstance(x, torch.Tensor):
            yield (
                prefix,
                (
                    str(x.dtype),
                    tuple(x.shape),
                    x.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes(),
                ),
            )
        else:
            yield prefix, x

    return dict(flat(torch.load(out, weights_only=True)))


def test_async_save_writes_the_same_checkpoint_as_sync(uninterrupted, exatrain_cli, tmp_path):
    """Same state saved in the background and in the foreground: every tensor byte-for-byte equal and
    every stored object equal (the files' internal order may differ)."""
    run = tmp_path / "async"
    r = exatrain_cli("train", "--nproc=2", f"--run.dir={run}", *COMMON, "--checkpoint.async_save=true")
    assert r.returncode == 0, r.stdout + r.stderr
    assert train_losses(run) == train_losses(uninterrupted)
    for step in ("step-6", "step-12"):
        a = _contents(run / "checkpoints" / step, tmp_path)
        s = _contents(uninterrupted / "checkpoints" / step, tmp_path)
        assert a.keys() == s.keys() and len(a) > 20
        assert [k for k in s if a[k] != s[k]] == [".app.config"]  # the config that produced each run
        changed = set(a[".app.config"].splitlines()) ^ set(s[".app.config"].splitlines())
        assert {line.split(" = ")[0] for line in changed} == {"dir", "async_save"}


def test_failed_background_save_is_reported(exatrain_cli, tmp_path):
    """The background writer fails: the partial folder points into /proc, where no file can be created
    (even by root). The failure must come back on the training thread at the next step, with a HINT."""
    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / ".step-6.partial").symlink_to("/proc/1")
    r = exatrain_cli(
        "train", "--nproc=1", f"--run.dir={tmp_path / 'run'}", *COMMON, "--checkpoint.async_save=true"
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "background save of step 6" in r.stderr and "HINT:" in r.stderr and "Traceback" not in r.stderr


def test_dropout_run_resumed_at_the_same_world_size_repeats_exactly(exatrain_cli, tmp_path):
    """Every rank's generators (torch, NumPy, Python) are in the checkpoint: dropout masks after the resume
    are the ones the uninterrupted run drew, so the losses are identical, not just close."""
    dropout = [*COMMON, "--model.dropout=0.2"]
    r = exatrain_cli("train", "--nproc=2", f"--run.dir={tmp_path / 'full'}", *dropout)
    assert r.returncode == 0, r.stdout + r.stderr
    run = tmp_path / "resumed"
    shutil.copytree(tmp_path / "full" / "checkpoints" / "step-6", run / "checkpoints" / "step-6")
    r = exatrain_cli("train", "--nproc=2", f"--run.dir={run}", *dropout, "--checkpoint.resume=auto")
    assert r.returncode == 0, r.stdout + r.stderr
    full, resumed = train_losses(tmp_path / "full"), train_losses(run)
    assert sorted(resumed) == list(range(7, 13))
    assert {s: full[s] for s in resumed} == resumed


def test_dropout_fsdp_run_resumed_in_the_same_layout_repeats_exactly(exatrain_cli, tmp_path):
    """The README's "in the same layout a resumed run repeats the uninterrupted one exactly, dropout
    included" beyond DDP: FSDP on 2 ranks, resumed from step 6 in the same layout."""
    dropout = [*COMMON, "--model.dropout=0.2", "--parallel.dp_replicate=1", "--parallel.dp_shard=2"]
    r = exatrain_cli("train", "--nproc=2", f"--run.dir={tmp_path / 'full'}", *dropout)
    assert r.returncode == 0, r.stdout + r.stderr
    run = tmp_path / "resumed"
    shutil.copytree(tmp_path / "full" / "checkpoints" / "step-6", run / "checkpoints" / "step-6")
    r = exatrain_cli("train", "--nproc=2", f"--run.dir={run}", *dropout, "--checkpoint.resume=auto")
    assert r.returncode == 0, r.stdout + r.stderr
    full, resumed = train_losses(tmp_path / "full"), train_losses(run)
    assert sorted(resumed) == list(range(7, 13))
    assert {s: full[s] for s in resumed} == resumed


def test_resume_in_another_layout_reseeds_deterministically(exatrain_cli, tmp_path):
    """A DDP checkpoint resumed under FSDP restores no generator (rank R is another part of the work) and
    reseeds every rank from the seed, its data-parallel rank and the step: two such resumes draw the same
    dropout masks (identical losses), and the masks are not the uninterrupted DDP run's (other losses)."""
    dropout = [*COMMON, "--model.dropout=0.2"]
    r = exatrain_cli("train", "--nproc=2", f"--run.dir={tmp_path / 'ddp'}", *dropout)
    assert r.returncode == 0, r.stdout + r.stderr
    losses = []
    for name in ("a", "b"):
        run = tmp_path / name
        shutil.copytree(tmp_path / "ddp" / "checkpoints" / "step-6", run / "checkpoints" / "step-6")
        r = exatrain_cli(
            "train",
            "--nproc=2",
            f"--run.dir={run}",
            *dropout,
            "--checkpoint.resume=auto",
            "--parallel.dp_replicate=1",
            "--parallel.dp_shard=2",
        )
        assert r.returncode == 0, r.stdout + r.stderr
        losses.append(train_losses(run))
    assert sorted(losses[0]) == list(range(7, 13)) and losses[0] == losses[1]
    ddp = train_losses(tmp_path / "ddp")
    # other dropout masks move the loss far more than the layouts' summation order (~1e-6)
    assert max(abs(losses[0][s] - ddp[s]) for s in losses[0]) > 1e-4, "reseeded: not the DDP run's generators"


def test_rank_killed_mid_save_keeps_the_previous_checkpoint(uninterrupted, exatrain_cli, tmp_path):
    """A real kill -9 of rank 1 while the step-12 save is in flight (rank 1 paused inside the write by the
    manager's test hook, rank 0's file already written): the partial folder is never used; the next run
    resumes from step-6, removes the partial one and trains on exactly like the uninterrupted run."""
    run, ckpts = tmp_path / "killed", tmp_path / "killed" / "checkpoints"
    partial = ckpts / ".step-12.partial"
    hook = {"EXATRAIN_TEST_SAVE_PAUSE": "12:300"}
    with started_exatrain(
        ["train", "--nproc=2", f"--run.dir={run}", *COMMON], cwd=tmp_path, env=hook
    ) as proc:
        wait_for(lambda: list(partial.glob("__0_*.distcp")), 180, "rank 0's part of the step-12 save", proc)
        os.kill(worker_pid(proc.pid, rank=1), signal.SIGKILL)
        code, out, err = finish(proc)
    assert code != 0, out + err
    assert partial.is_dir() and not (ckpts / "step-12").exists()
    assert max(train_losses(run)) > 6, "the killed run logged steps after step-6, which the resume must drop"
    assert sorted(p.name for p in ckpts.iterdir()) == [".step-12.partial", "step-6"]

    r = exatrain_cli("train", "--nproc=2", f"--run.dir={run}", *COMMON, "--checkpoint.resume=auto")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"resumed from {ckpts / 'step-6'} at step 6" in r.stdout
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-12", "step-6"]
    # metrics.jsonl was cut back to step 6 at the resume: every step once, in order (train_records checks)
    assert [m["step"] for m in train_records(run)] == list(range(1, 13))
    assert train_losses(run) == train_losses(uninterrupted)
    assert batch_digests(run) == batch_digests(uninterrupted)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process on purpose
def test_async_save_holds_the_state_of_its_step_although_training_goes_on(tmp_path):
    """The background copy of the state must finish before the optimizer changes it: an SGD step right after
    an async save (single process, no group) must not leak into the checkpoint. The copy is made slow on
    purpose (a 0.5 s sleep wrapped around torch's stager, the only stand-in here) so that without the wait
    the step would always land first."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from exatrain.checkpoint import CheckpointManager, TrainingState

    model = torch.nn.Linear(64, 64, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    state = TrainingState(model, optimizer, scheduler, lambda: {"step": 1}, lambda p: None, "config")
    manager = CheckpointManager(tmp_path / "ckpts", interval=1, keep=0, async_save=True)
    manager.start("")
    copy = manager.stager._stage
    manager.stager._stage = lambda *a, **kw: (time.sleep(0.5), copy(*a, **kw))[1]
    before = model.weight.detach().clone()
    model.weight.grad = torch.ones_like(model.weight)
    manager.save(1, state, blocking=False)
    optimizer.step()  # changes every weight by -1 while the save is in flight
    manager.wait()
    dcp_to_torch_save(str(tmp_path / "ckpts" / "step-1"), str(tmp_path / "whole.pt"))
    saved = torch.load(tmp_path / "whole.pt", weights_only=True)["app"]["model"]["weight"]
    assert torch.equal(saved, before) and not torch.equal(saved, model.weight.detach())
