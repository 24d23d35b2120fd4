"""examples/vision_resnet: torchvision's ResNet-18, FSDP2 over 2 ranks through exatrain.parallelize,
checkpoint and resume, on a tiny generated ImageFolder directory (32x32 PNGs made with PIL).

Real processes started as a user does (`exatrain run --nproc 2`: real gloo process groups)."""

import pytest
import torch

from tests.examples.helpers import make_data, max_relative_difference, run_example, step_losses

pytestmark = pytest.mark.dist

TINY = ["--batch-size", "8", "--image-size", "32"]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_data.make_images(tmp_path_factory.mktemp("data") / "images", classes=3, per_class=8)


def test_two_ranks_match_one_process_with_groupnorm(images, tmp_path):
    """FSDP2 over 2 ranks vs one process, same global batch: losses within 1e-5 relative (fp32). With
    GroupNorm: BatchNorm normalises over each rank's share of the batch, so it differs by design."""
    args = [*TINY, "--data-dir", images, "--steps", "4", "--norm", "group", "--lr", "0.003"]
    out = run_example("vision_resnet/train.py", [*args, "--run-dir", tmp_path / "two"], 2, tmp_path)
    assert "dp_shard 2" in out and "(FSDP)" in out
    run_example("vision_resnet/train.py", [*args, "--run-dir", tmp_path / "one"], 1, tmp_path)
    one, two = step_losses(tmp_path / "one"), step_losses(tmp_path / "two")
    assert sorted(two) == [1, 2, 3, 4] and two[4] < two[1]
    assert max_relative_difference(two, one) <= 1e-5, (one, two)


def test_resumed_run_continues_identically(images, tmp_path):
    """Default model (BatchNorm), 2 ranks: a run stopped after its step-2 checkpoint and started again
    with the same run directory gives the uninterrupted run's losses (steps 3-4) and final weights exactly."""
    args = [*TINY, "--data-dir", images, "--checkpoint-interval", "2"]
    run_example(
        "vision_resnet/train.py", [*args, "--steps", "4", "--run-dir", tmp_path / "whole"], 2, tmp_path
    )
    run_example(
        "vision_resnet/train.py", [*args, "--steps", "2", "--run-dir", tmp_path / "split"], 2, tmp_path
    )
    assert (tmp_path / "split" / "checkpoints" / "step-2").is_dir()
    out = run_example(
        "vision_resnet/train.py", [*args, "--steps", "4", "--run-dir", tmp_path / "split"], 2, tmp_path
    )
    assert "resumed from" in out and "at step 2" in out
    whole, split = step_losses(tmp_path / "whole"), step_losses(tmp_path / "split")
    assert split == whole and sorted(whole) == [1, 2, 3, 4]
    a = torch.load(tmp_path / "whole" / "final.pt", weights_only=True)
    b = torch.load(tmp_path / "split" / "final.pt", weights_only=True)
    assert "layer4.1.conv2.weight" in a and a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a if "running" not in k and "num_batches" not in k)
