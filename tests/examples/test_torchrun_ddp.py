"""examples/torchrun_ddp: the unmodified torchrun-style DDP script at 2 ranks against 1 process with the same
global batch.

Real processes started as a user does: `exatrain run --nproc 2 train.py` (real gloo process groups under
torchrun's agent) and `python train.py` (no launcher: the script's world of one)."""

import json

import pytest

from tests.examples.helpers import run_example

pytestmark = pytest.mark.dist

TOLERANCE = 1e-5  # relative, fp32 (measured here: at most 5.5e-7)


def _ranks(out_dir, world: int) -> list[dict]:
    return [json.loads((out_dir / f"rank-{r}.json").read_text()) for r in range(world)]


def test_two_ranks_match_one_process_with_the_same_global_batch(tmp_path):
    """2 ranks x batch 8 vs 1 process x batch 16 (the same global batch, 2 epochs of 256 samples: 32 steps).
    DistributedSampler gives rank r the entries r, r+2, ... of the epoch's seeded permutation, so the two
    ranks' batches of a step together are the one process's batch, and DDP averages the gradients: every
    step's loss (the mean of the two ranks' losses on their equal halves), each epoch's mean loss and the
    final weights (sum of all parameters) within 1e-5 relative of the one process's."""
    args = ["--epochs", "2"]
    run_example("torchrun_ddp/train.py", [*args, "--batch-size", "8", "--out", tmp_path / "two"], 2, tmp_path)
    run_example(
        "torchrun_ddp/train.py", [*args, "--batch-size", "16", "--out", tmp_path / "one"], 1, tmp_path
    )
    (one,), two = _ranks(tmp_path / "one", 1), _ranks(tmp_path / "two", 2)
    assert one["world_size"] == 1 and one["seen"]["RANK"] is None  # started without a launcher
    assert [r["world_size"] for r in two] == [2, 2] and [r["samples"] for r in two] == [128, 128]
    single = one["step_losses"]
    paired = [(a + b) / 2 for a, b in zip(two[0]["step_losses"], two[1]["step_losses"], strict=True)]
    assert len(single) == len(paired) == 32 and single[-1] < single[0]  # it trained
    worst = max(abs(p - s) / abs(s) for p, s in zip(paired, single))
    assert worst <= TOLERANCE, (worst, single, paired)
    assert abs(two[0]["checksum"] - one["checksum"]) <= TOLERANCE * abs(one["checksum"])
    assert [abs(a - b) <= TOLERANCE * abs(b) for a, b in zip(two[0]["losses"], one["losses"])] == [True, True]
