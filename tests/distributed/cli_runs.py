"""Training runs through the real CLI for parity tests, and a plain model's view of their results."""

import torch

from exatrain.config import load_config
from exatrain.data import eval_batches
from exatrain.models import configured_shape
from exatrain.models.transformer import TransformerLM
from exatrain.observe import read_metrics
from exatrain.train.entry import prepare_data
from tests.conftest import run_exatrain


def train_run(tmp, name: str, nproc: int, args: list[str]) -> dict:
    """`exatrain train --nproc=N --run.dir=tmp/name ARGS`; returns its directory, stdout, training losses
    and gradient norms (in step order; norms with train.grad_clip > 0), last eval loss and final.pt."""
    run = tmp / name
    r = run_exatrain(["train", f"--nproc={nproc}", f"--run.dir={run}", *args], cwd=tmp)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    metrics = read_metrics(run / "metrics.jsonl")
    return {
        "dir": run,
        "stdout": r.stdout,
        "losses": [m["loss"] for m in metrics if m["kind"] == "train"],
        "grad_norms": [m.get("grad_norm") for m in metrics if m["kind"] == "train"],
        "eval": [m["loss"] for m in metrics if m["kind"] == "eval"][-1],
        "final": torch.load(run / "final.pt", weights_only=True),
    }


def plain_eval_loss(run_dir, state) -> float:
    """Eval loss of a plain single-process model loaded from `state` (strictly: every parameter, unsharded,
    under plain names), on the windows the run in `run_dir` evaluated."""
    cfg = load_config(str(run_dir / "config.toml"))
    corpus = prepare_data(cfg)
    model = TransformerLM(configured_shape(cfg.model), corpus.vocab_size, cfg.data.seq_len)
    model.load_state_dict(state)
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in eval_batches(
            corpus.split(cfg.data.eval_split),
            cfg.data.seq_len,
            cfg.train.micro_batch_size,
            max_total_batches=cfg.train.eval_batches,
        ):
            total += model(x, y).item() * y.numel()
            count += y.numel()
    return total / count


def check_weight_placement(run_dir) -> None:
    """Replicas agree where there are replicas, and the layout really splits the weights where it should.

    Ranks are placed row-major on the mesh (pp, dp_replicate, dp_shard, tp); ranks that differ only in their
    dp_replicate coordinate are replicas and must hold bit-identical weights (the digest each rank wrote to
    ranks/rank-N.json); ranks at different places (other pipeline stage, FSDP shard or TP shard) must hold
    different weights, else the layout was not applied. "weights in sync" alone is vacuous for layouts
    without replicas, so it is asserted only where dp_replicate > 1."""
    import itertools
    import json

    from exatrain.distributed.parallel_dims import ParallelDims

    summary = json.loads((run_dir / "summary.json").read_text())
    world = summary["world_size"]
    dims = ParallelDims.from_config(load_config(str(run_dir / "config.toml")).parallel, world)
    shape = (dims.pp, dims.dp_replicate, dims.dp_shard, dims.tp)
    digests = [
        json.loads((run_dir / "ranks" / f"rank-{r}.json").read_text())["weights_sha256"] for r in range(world)
    ]
    places: dict[tuple, set] = {}
    for rank, (pp, _, shard, tp) in enumerate(itertools.product(*map(range, shape))):
        places.setdefault((pp, shard, tp), set()).add(digests[rank])
    if dims.dp_replicate > 1:
        assert summary["weights_in_sync"] and all(len(d) == 1 for d in places.values()), places
    distinct = {next(iter(d)) for d in places.values()}
    assert len(distinct) == len(places), (
        f"ranks at different places of {shape} hold the same weights: {places}"
    )


def max_diff(a: list[float], b: list[float]) -> float:
    """Largest absolute difference of two equally long sequences."""
    assert len(a) == len(b), (a, b)
    return max(abs(x - y) for x, y in zip(a, b))


def describe_diffs(run: dict, reference: dict) -> str:
    """The measured differences of a run from the reference, for the test output (printed before
    asserting)."""
    norms = (
        max_diff(run["grad_norms"], reference["grad_norms"])
        if None not in run["grad_norms"]
        else float("nan")
    )
    return (
        f"max loss diff {max_diff(run['losses'], reference['losses']):.1e}, grad norm {norms:.1e}, "
        f"eval {abs(run['eval'] - reference['eval']):.1e}"
    )


def assert_same_training(
    run: dict, reference: dict, loss_tol: float, grad_norm_tol: float
) -> tuple[float, float]:
    """Check a layout's run against the single-process reference: the same steps, losses and gradient
    norms (clipping must be active at every step, so clipping with the full model's norm is exercised),
    the same eval loss, a final.pt with the same entries whose plain-model eval loss is what the run
    reported, replicas in sync. Returns the (max, mean) absolute weight difference, for the caller's
    tolerance."""
    assert max_diff(run["losses"], reference["losses"]) <= loss_tol, (run["losses"], reference["losses"])
    clip = float(load_config(str(reference["dir"] / "config.toml")).train.grad_clip)
    assert clip > 0 and min(reference["grad_norms"]) > clip, "clipping should be active at every step"
    assert max_diff(run["grad_norms"], reference["grad_norms"]) <= grad_norm_tol, (
        run["grad_norms"],
        reference["grad_norms"],
    )
    assert abs(run["eval"] - reference["eval"]) <= loss_tol, (run["eval"], reference["eval"])
    ref_w, w = reference["final"], run["final"]
    assert w.keys() == ref_w.keys()
    plain = plain_eval_loss(run["dir"], w)
    assert abs(plain - run["eval"]) <= loss_tol, (plain, run["eval"])
    check_weight_placement(run["dir"])
    worst = max((w[k] - ref_w[k]).abs().max().item() for k in w)
    mean = sum((w[k] - ref_w[k]).abs().sum().item() for k in w) / sum(v.numel() for v in w.values())
    return worst, mean
