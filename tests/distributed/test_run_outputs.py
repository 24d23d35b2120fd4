"""What a run leaves behind, checked in real runs (one process, tiny model, few steps):

- `best.pt` is the model of the lowest evaluation: loaded into a plain model, its eval loss on the run's
  windows is the lowest one the run recorded after step 0, in a run of its own whose learning rate is high
  enough that the loss rises again after step 2, so the lowest evaluation is not the last one and best.pt
  must be another model than final.pt;
- `checkpoint.keep=2` leaves exactly the newest two of the checkpoints a run wrote;
- `train.precision=bf16` (autocast) and `parallel.compile=true` with the default inductor backend both run on
  CPU: the run trains, its losses are close to the fp32 eager run's but not equal (bf16 is really applied).
"""

import math

import pytest
import torch

from exatrain.observe import read_metrics
from tests.distributed.cli_runs import plain_eval_loss, train_run

pytestmark = pytest.mark.dist

COMMON = [
    "--train.steps=6",
    "--train.log_every=1",
    "--train.eval_every=2",
    "--train.eval_at_start=true",
    "--train.eval_batches=2",
    "--train.global_batch_size=8",
    "--train.micro_batch_size=8",
    "--train.warmup_steps=2",
    "--data.seq_len=32",
    "--checkpoint.interval=2",
    "--checkpoint.keep=2",
]


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    return train_run(tmp_path_factory.mktemp("outputs"), "fp32", 1, COMMON)


# lr 3e-2 overshoots after the warmup: the evaluations after
# steps 1, 2, 3 fall, then rise (about 6.31, 6.14, 7.09)
BEST = [
    "--train.steps=3",
    "--train.log_every=1",
    "--train.eval_every=1",
    "--train.eval_at_start=false",
    "--train.eval_batches=2",
    "--train.global_batch_size=8",
    "--train.micro_batch_size=8",
    "--train.warmup_steps=2",
    "--train.lr=3e-2",
    "--data.seq_len=32",
]


def test_best_pt_is_the_model_of_the_lowest_evaluation(tmp_path):
    run = train_run(tmp_path, "best", 1, BEST)
    evals = [m for m in read_metrics(run["dir"] / "metrics.jsonl") if m["kind"] == "eval" and m["step"] > 0]
    assert [m["step"] for m in evals] == [1, 2, 3]
    best = min(m["loss"] for m in evals)
    # the precondition of this test: were the last evaluation the lowest, final.pt would pass for best.pt
    assert best < evals[-1]["loss"], f"the loss no longer rises after its lowest evaluation: {evals}"
    state = torch.load(run["dir"] / "best.pt", weights_only=True)
    assert abs(plain_eval_loss(run["dir"], state) - best) <= 1e-5
    assert state.keys() == run["final"].keys()
    assert any(not torch.equal(state[k], run["final"][k]) for k in state)


def test_keep_leaves_the_newest_checkpoints(fp32):
    assert sorted(p.name for p in (fp32["dir"] / "checkpoints").iterdir()) == ["step-4", "step-6"]


def test_bf16_autocast_and_inductor_compile_run_on_cpu(fp32, tmp_path):
    run = train_run(
        tmp_path, "bf16_inductor", 1, [*COMMON, "--train.precision=bf16", "--parallel.compile=true"]
    )
    assert 'compile_backend = "inductor"' in (run["dir"] / "config.toml").read_text()
    assert all(math.isfinite(x) for x in run["losses"]) and len(run["losses"]) == 6
    diff = max(abs(a - b) for a, b in zip(run["losses"], fp32["losses"]))
    assert 0 < diff <= 5e-2, (run["losses"], fp32["losses"])
