"""examples/hf_causal_lm: a Hugging Face LlamaForCausalLM built from a config (no download; the runs have
HF_HUB_OFFLINE=1), FSDP2 per decoder layer through exatrain.parallelize, checkpoint, and resume under
another world size (2 ranks -> 1 process), on a tiny generated WikiText-2-format directory.

Real processes started as a user does (`exatrain run --nproc 2`: real gloo process groups)."""

import pytest
import torch

from tests.examples.helpers import make_data, max_relative_difference, run_example, step_losses

pytestmark = pytest.mark.dist

TINY = ["--batch-size", "8", "--hidden-size", "32", "--layers", "2", "--heads", "4", "--seq-len", "32"]
TOLERANCE = 1e-5  # relative, fp32


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted runs: 4 steps on 2 ranks and on 1 process."""
    root = tmp_path_factory.mktemp("hf")
    data = make_data.make_wikitext(root / "wikitext-2", lines=(120, 10, 10))
    args = [*TINY, "--data-dir", data, "--steps", "4"]
    out = run_example("hf_causal_lm/train.py", [*args, "--run-dir", root / "two"], 2, root)
    run_example("hf_causal_lm/train.py", [*args, "--run-dir", root / "one"], 1, root)
    return root, data, out


def test_two_ranks_match_one_process(runs):
    """FSDP2 over 2 ranks vs one process with the same global batch: losses within 1e-5 relative (fp32)."""
    root, _, out = runs
    assert "dp_shard 2" in out and "(FSDP)" in out
    one, two = step_losses(root / "one"), step_losses(root / "two")
    assert sorted(two) == [1, 2, 3, 4] and two[4] < two[1]
    assert max_relative_difference(two, one) <= TOLERANCE, (one, two)


def test_fsdp_checkpoint_of_two_ranks_resumes_on_one_process(runs, tmp_path):
    """Checkpointed at step 2 on 2 ranks (FSDP2), resumed on 1 process: steps 3-4 and the final weights
    agree with the uninterrupted 2-rank run within 1e-5 relative."""
    root, data, _ = runs
    args = [*TINY, "--data-dir", data, "--checkpoint-interval", "2", "--run-dir", tmp_path / "run"]
    run_example("hf_causal_lm/train.py", [*args, "--steps", "2"], 2, tmp_path)
    out = run_example("hf_causal_lm/train.py", [*args, "--steps", "4"], 1, tmp_path)
    assert "resumed from" in out and "at step 2" in out
    resumed, whole = step_losses(tmp_path / "run"), step_losses(root / "two")
    assert sorted(resumed) == [1, 2, 3, 4]
    assert max_relative_difference(resumed, whole) <= TOLERANCE, (resumed, whole)
    a = torch.load(root / "two" / "final.pt", weights_only=True)
    b = torch.load(tmp_path / "run" / "final.pt", weights_only=True)
    assert "model.layers.1.mlp.down_proj.weight" in a and a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=TOLERANCE, atol=1e-6)
