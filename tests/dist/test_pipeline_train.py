"""Pipeline-parallel layouts (PP, PP x DP, PP x DP x TP) through the real CLI against one process.

All runs: 4 blocks, seed 0, 16 windows per optimizer step as micro-batches of 4 (so 4 pipeline
microbatches or fewer split each micro-batch evenly), fp32, dropout 0, 4 steps, gradient clipping at
1.0; every layout starts from the reference's weights (train/build.py). Only float summation order
differs (microbatch sums, reductions across dp/tp, accumulation).

Tolerances (fp32): 1e-4 absolute on every step's training loss and on the final eval loss (measured:
~1e-6); on the final weights, 1e-6 on the mean absolute difference (measured: 3e-9, 1.5e-8 with TP)
and 5e-4 on the largest one (measured: 4e-5, and 2e-4 on ONE token-embedding entry under
pp2 x fsdp2 x tp2, median 6e-8: AdamW divides by sqrt(v), which magnifies summation-order noise on
gradients near its eps).

final.pt of every layout (gathered across stages and shards on rank 0) is loaded into a plain model
here; its eval loss on the same windows must equal what the run reported. A DCP checkpoint written by
a 2-stage pipeline resumes in ONE process, and the single process's checkpoint resumes as pp2 x fsdp2
(DCP matches entries by parameter name, whatever the layout).
"""

import pytest
import torch

from exatrain.config import load_config
from exatrain.data import eval_batches
from exatrain.models.transformer import build_model
from exatrain.train.records import read_metrics
from exatrain.train.run import prepare_data
from tests.conftest import run_exatrain

pytestmark = pytest.mark.dist

STEPS = 4
COMMON = [f"--train.steps={STEPS}", "--train.log_every=1", "--train.eval_every=0", "--train.eval_at_start=false",
          "--train.eval_batches=4", "--train.global_batch_size=16", "--train.micro_batch_size=4",
          "--train.warmup_steps=2", "--data.seq_len=32", "--model.n_layers=4"]
LOSS_TOL = 1e-4
WEIGHT_MEAN_TOL, WEIGHT_MAX_TOL = 1e-6, 5e-4
PP_ONLY = ["--parallel.dp_replicate=1"]
LAYOUTS = {  # name: (ranks, overrides)
    # also writes a DCP checkpoint at step 2 (test_pipeline_checkpoint_resumes_in_one_process)
    "pp2_gpipe": (2, [*PP_ONLY, "--parallel.pp=2", "--parallel.pp_schedule=gpipe", "--checkpoint.interval=2"]),
    "pp2_interleaved_1f1b_ac": (2, [*PP_ONLY, "--parallel.pp=2", "--parallel.pp_schedule=interleaved_1f1b",
                                    "--parallel.pp_stages_per_rank=2", "--parallel.activation_checkpoint=full"]),
    "pp4_1f1b": (4, [*PP_ONLY, "--parallel.pp=4", "--parallel.pp_schedule=1f1b"]),
    "pp2_x_ddp2": (4, ["--parallel.pp=2", "--parallel.dp_replicate=2"]),
    "pp2_x_fsdp2": (4, [*PP_ONLY, "--parallel.pp=2", "--parallel.dp_shard=2"]),
    # the one 8-rank case: 3-D, with sequence parallel and loss parallel on the TP dimension
    "pp2_x_fsdp2_x_tp2_sp_lp": (8, [*PP_ONLY, "--parallel.pp=2", "--parallel.dp_shard=2", "--parallel.tp=2",
                                    "--parallel.sequence_parallel=true", "--parallel.loss_parallel=true"]),
}


def _train(tmp, name, nproc, overrides):
    run = tmp / name
    r = run_exatrain(["train", f"--nproc={nproc}", f"--run.dir={run}", *COMMON, *overrides], cwd=tmp)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    metrics = read_metrics(run / "metrics.jsonl")
    return {"dir": run, "stdout": r.stdout,
            "losses": {m["step"]: m["loss"] for m in metrics if m["kind"] == "train"},
            "eval": [m["loss"] for m in metrics if m["kind"] == "eval"][-1],
            "final": torch.load(run / "final.pt", weights_only=True)}


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("pipeline")


@pytest.fixture(scope="module")
def reference(tmp):
    """One process, no parallelism: the run every layout is compared with (checkpoint at step 2)."""
    return _train(tmp, "reference", 1, ["--checkpoint.interval=2"])


@pytest.fixture(scope="module")
def layout_run(tmp):
    """Train a named layout once per module (the checkpoint test reuses the pp2_gpipe run)."""
    runs = {}

    def get(name):
        if name not in runs:
            runs[name] = _train(tmp, name, *LAYOUTS[name])
        return runs[name]
    return get


def _plain_eval_loss(run_dir, state) -> float:
    """Eval loss of a plain single-process model loaded from `state`, on the windows the run evaluated."""
    cfg = load_config(str(run_dir / "config.toml"))
    corpus = prepare_data(cfg)
    model = build_model(cfg.model.size, corpus.vocab_size, cfg.data.seq_len, n_layers=cfg.model.n_layers)
    model.load_state_dict(state)  # strict: every stage's parameters, unsharded, under plain names
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in eval_batches(corpus.split(cfg.data.eval_split), cfg.data.seq_len, cfg.train.micro_batch_size,
                                 max_total_batches=cfg.train.eval_batches):
            total += model(x, y).item() * y.numel()
            count += y.numel()
    return total / count


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), (a, b)
    return max(abs(a[k] - b[k]) for k in a)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_pipeline_layout_matches_single_process(reference, layout_run, name):
    run = layout_run(name)
    assert len(run["losses"]) == STEPS
    assert _max_diff(run["losses"], reference["losses"]) <= LOSS_TOL, (run["losses"], reference["losses"])
    assert abs(run["eval"] - reference["eval"]) <= LOSS_TOL, (run["eval"], reference["eval"])
    ref_w, w = reference["final"], run["final"]
    assert w.keys() == ref_w.keys()
    worst = max((w[k] - ref_w[k]).abs().max().item() for k in w)
    mean = sum((w[k] - ref_w[k]).abs().sum().item() for k in w) / sum(v.numel() for v in w.values())
    assert mean <= WEIGHT_MEAN_TOL and worst <= WEIGHT_MAX_TOL, f"weight differences: mean {mean}, max {worst}"
    assert abs(_plain_eval_loss(run["dir"], w) - run["eval"]) <= LOSS_TOL
    assert "weights in sync" in run["stdout"] and "NO" not in run["stdout"].split("weights in sync")[-1]


def test_pipeline_checkpoint_resumes_in_one_process(reference, layout_run, tmp):
    step2 = layout_run("pp2_gpipe")["dir"] / "checkpoints" / "step-2"
    assert step2.is_dir()
    resumed = _train(tmp, "resumed_1proc", 1, [f"--checkpoint.resume={step2}"])
    assert sorted(resumed["losses"]) == [3, 4]
    assert max(abs(resumed["losses"][s] - reference["losses"][s]) for s in (3, 4)) <= LOSS_TOL, \
        (resumed["losses"], reference["losses"])


def test_single_process_checkpoint_resumes_as_pipeline(reference, tmp):
    step2 = reference["dir"] / "checkpoints" / "step-2"
    resumed = _train(tmp, "resumed_pp2_x_fsdp2", 4, [*LAYOUTS["pp2_x_fsdp2"][1], f"--checkpoint.resume={step2}"])
    assert sorted(resumed["losses"]) == [3, 4]
    assert max(abs(resumed["losses"][s] - reference["losses"][s]) for s in (3, 4)) <= LOSS_TOL, \
        (resumed["losses"], reference["losses"])
