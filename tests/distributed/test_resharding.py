"""Resharding on resume: a checkpoint written under one data-parallel layout and world size (DDP at 4, FSDP
at 2 or 4 ranks) resumes under another and trains on exactly like an uninterrupted run with the same
global batch.

Checked per case, through the real CLI on real gloo groups:
- losses: every step after the resume equals the uninterrupted run's (DDP at 2 ranks) within 1e-5
  absolute (only the float summation order differs between layouts); the writing run's own steps too;
- samples: the data position stored in the checkpoint is in global sample terms, so the global batches the
  trainers really consumed across the resume (steps 1-6 by the writing run's ranks, 7-12 by the resumed
  run's ranks; each step's digest in metrics.jsonl, summed over the data-parallel ranks) are exactly the
  uninterrupted run's, step by step: none skipped, none repeated.
"""

import shutil

import pytest
import torch

from tests.conftest import run_exatrain
from tests.distributed.helpers import batch_digests, train_losses

pytestmark = pytest.mark.dist

BATCH, MICRO, SEQ = 16, 2, 32
COMMON = [
    "--train.steps=12",
    "--train.log_every=1",
    "--train.eval_every=0",
    "--train.eval_at_start=false",
    "--train.eval_batches=2",
    f"--train.global_batch_size={BATCH}",
    f"--train.micro_batch_size={MICRO}",
    "--train.warmup_steps=2",
    f"--data.seq_len={SEQ}",
    "--checkpoint.interval=6",
    "--checkpoint.keep=0",
]
DDP = ["--parallel.dp_replicate=-1", "--parallel.dp_shard=1"]
FSDP = ["--parallel.dp_replicate=1", "--parallel.dp_shard=-1"]
TOL = 1e-5


def _train(tmp, name, nproc, layout, *extra):
    run = tmp / name
    r = run_exatrain(["train", f"--nproc={nproc}", f"--run.dir={run}", *COMMON, *layout, *extra], cwd=tmp)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return run, r.stdout


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run: 12 steps of DDP on 2 ranks."""
    tmp = tmp_path_factory.mktemp("reshard")
    return _train(tmp, "reference", 2, DDP)[0]


def _position(ckpt) -> dict:
    """The sampler position stored in a checkpoint (read offline, as `exatrain checkpoint export` does)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    whole = ckpt.parent / f"{ckpt.name}.pt"
    dcp_to_torch_save(str(ckpt), str(whole))
    return torch.load(whole, weights_only=True)["app"]["progress"]["sampler"]


@pytest.mark.parametrize(
    "before, after",
    [
        ((4, DDP), (2, FSDP)),
        ((2, FSDP), (4, DDP)),
        ((4, FSDP), (2, FSDP)),
    ],
    ids=["ddp4-to-fsdp2", "fsdp2-to-ddp4", "fsdp4-to-fsdp2"],
)
def test_resume_under_another_layout_and_world_size(reference, tmp_path, before, after):
    (n1, layout1), (n2, layout2) = before, after
    writer, _ = _train(
        tmp_path, "writer", n1, layout1
    )  # all 12 steps: the LR schedule depends on train.steps
    resumed = tmp_path / "resumed"
    shutil.copytree(writer / "checkpoints" / "step-6", resumed / "checkpoints" / "step-6")
    _, out = _train(tmp_path, "resumed", n2, layout2, "--checkpoint.resume=auto")
    assert "at step 6" in out and ("FSDP" if layout2 is FSDP else "DDP") in out

    expected, first, second = train_losses(reference), train_losses(writer), train_losses(resumed)
    assert sorted(second) == list(range(7, 13))
    worst = max(abs(expected[s] - got[s]) for got in (first, second) for s in got)
    assert worst <= TOL, (expected, first, second)

    start, end = _position(writer / "checkpoints" / "step-6"), _position(resumed / "checkpoints" / "step-12")
    assert end == _position(reference / "checkpoints" / "step-12")
    assert start["consumed"] == 6 * BATCH
    want = batch_digests(reference)
    assert sorted(want) == list(range(1, 13)) and len(set(want.values())) == 12, "12 different global batches"
    consumed = {s: d for s, d in batch_digests(writer).items() if s <= 6} | batch_digests(resumed)
    assert consumed == want, "the trainers consumed other global batches than the uninterrupted run"
