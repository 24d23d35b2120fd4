"""Time and cost to a token target (`exatrain plan --target-tokens N`, exatrain/tools/plan/target.py): wall
time and billing units from the predicted step and `exatrain cost`'s code, the published runs' ratio that
applies to a layout, the sentence for a resource application, and the same for every layout of
`--search`. The step-time model itself: tests/unit/test_plan_time.py."""

import json

import pytest

from exatrain.errors import ConfigError
from exatrain.slurm.profiles import load_profile
from exatrain.tools.plan import estimate


def test_target_tokens_wall_time_and_billing_use_the_cost_code():
    """Wall time = steps x step time; units = `exatrain cost`'s arithmetic (estimate_cost) for the layout's
    nodes and that wall time; the numbers below are the profiles' rules worked by hand."""
    import dataclasses

    from exatrain.slurm.billing import estimate_cost
    from exatrain.slurm.spec import JobSpec
    from exatrain.tools.plan.target import target_cost

    lumi = load_profile("lumi-g")
    # 1.08e6 tokens / 1000 per step = 1080 steps x 10 s = 3
    # h on 16 GCDs = 2 whole nodes x 4 GPU-hours/node-hour
    t = target_cost(1_080_000, 1000, 10.0, 16, lumi, "a model")
    assert (t.steps, t.nodes, t.gpus_per_node, t.partition) == (1080, 2, 8, "standard-g")
    assert t.wall_time_h == pytest.approx(3.0) and t.units == pytest.approx(2 * 3 * 4.0)
    same = estimate_cost(JobSpec(nodes=2, gpus_per_node=8, time="03:00:00"), lumi)
    assert t.units == pytest.approx(same.units) and t.unit == same.unit == "GPU-hours"
    assert "3 hours of wall time" in t.sentence and "24.0 GPU-hours" in t.sentence and "margin" in t.sentence
    # the bundled profile's constants are published figures, and the sentence says so (never "measured")
    assert "from published hardware figures (data sheets and public measurements), not measured" in t.sentence
    own = dataclasses.replace(lumi, hardware=dataclasses.replace(lumi.hardware, source="measured"))
    sentence = target_cost(1_080_000, 1000, 10.0, 16, own, "a model").sentence
    assert "from hardware constants measured on the site with exatrain doctor" in sentence
    # the range real steps fell in on the published runs (estimate.PUBLISHED, recomputed from the validation
    # table by test_plan_validation.py), applied to the wall time and the units, and said in the sentence
    low, high = estimate.PUBLISHED.low, estimate.PUBLISHED.high
    assert t.wall_time_range_h == pytest.approx((3.0 * low, 3.0 * high))
    assert t.units_range == pytest.approx((24.0 * low, 24.0 * high))
    assert f"measured step was {low:.2f} to {high:.2f} times the predicted one" in t.sentence
    assert f"{3.0 * low:.3g} to {3.0 * high:.3g} hours" in t.sentence
    # a partial last step counts whole; JUWELS Booster bills 48 core-hours per node-hour and allows 24 h jobs:
    # 1001 steps x 108 s = 30.03 h on 4 nodes -> 2 jobs, 4 x 48 x 30.03 core-hours
    t = target_cost(1_000_001, 1000, 108.0, 16, load_profile("juwels-booster"), "a model")
    assert t.steps == 1001 and t.jobs == 2 and t.wall_time_h == pytest.approx(30.03)
    assert t.units == pytest.approx(4 * 48 * 30.03) and t.unit == "core-hours"
    with pytest.raises(ConfigError, match="--target-tokens"):
        target_cost(0, 1000, 1.0, 16, lumi, "a model")


def test_a_layout_that_does_not_fit_gets_a_hint_and_no_sentence_for_an_application(exatrain_cli):
    """A 3.2B-parameter DDP layout on 40 GiB A100s (fp32 weights, gradients and AdamW: ~48 GiB before
    activations) does not fit: the plan says how to make it fit, and offers no sentence for a resource
    application (it would size an allocation for a job that cannot run). The first advice, sharding, fits."""
    args = ["plan", "--site=juwels-booster", "--world-size=8", "--target-tokens=1e9", "--model.size=tiny"]
    args += ["--model.dim=8192", "--model.n_layers=4", "--model.n_heads=64", "--data.seq_len=256"]
    args += ["--train.global_batch_size=8", "--train.micro_batch_size=1"]
    r = exatrain_cli(*args, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "verdict: does not fit" in r.stdout
    hint = next(line for line in r.stdout.splitlines() if line.startswith("HINT:"))
    assert "--parallel.dp_shard=N" in hint and "exatrain plan --search" in hint
    assert "for a resource application: none: this layout does not fit" in r.stdout
    assert "Training a " not in r.stdout
    r = exatrain_cli(*args, "--parallel.dp_shard=8", timeout=300)
    assert r.returncode == 0, r.stderr
    assert "verdict: fits" in r.stdout and "HINT:" not in r.stdout
    assert "for a resource application: Training a " in r.stdout


def test_a_layout_sharding_its_parameters_over_nodes_is_said_unvalidated(exatrain_cli):
    """--time and --search say when FSDP's group spans nodes (LUMI-G: 8 GPUs per node) that the model hides
    its gathers there without validation, with the ratio of the published ZeRO-3 runs read
    (estimate.SHARDED_ACROSS_NODES); FSDP within a node (HSDP 2 x 8) and FSDP on one node say nothing."""
    args = [
        "plan",
        "--model.size=tiny",
        "--data.seq_len=64",
        "--train.micro_batch_size=2",
        "--site",
        "lumi-g",
    ]
    r = exatrain_cli(
        *args, "--world-size", "16", "--train.global_batch_size=32", "--parallel.dp_shard=16", "--time"
    )
    assert r.returncode == 0, r.stderr
    low, high = estimate.SHARDED_ACROSS_NODES.low, estimate.SHARDED_ACROSS_NODES.high
    assert "parameters sharded over 2 nodes" in r.stdout and f"took {low:.2f} to {high:.2f} x" in r.stdout
    for world, layout in (("16", "--parallel.dp_replicate=2"), ("8", "--parallel.dp_replicate=1")):
        r = exatrain_cli(
            *args,
            "--world-size",
            world,
            "--train.global_batch_size=32",
            layout,
            "--parallel.dp_shard=8",
            "--time",
        )
        assert r.returncode == 0 and "sharded over" not in r.stdout, (layout, r.stderr)
    r = exatrain_cli(
        *args, "--world-size", "16", "--train.global_batch_size=32", "--search", "--json", "--top", "50"
    )
    assert r.returncode == 0, r.stderr
    layouts = json.loads(r.stdout)["layouts"]
    across = [lay for lay in layouts if lay["degrees"]["dp_shard"] * lay["degrees"]["tp"] > 8]
    assert across and all("parameters sharded over 2 nodes" in lay["why"] for lay in across)
    assert all("sharded over" not in lay["why"] for lay in layouts if lay not in across)


def test_a_layout_sharded_over_nodes_is_sized_at_the_zero3_runs_ratio(exatrain_cli):
    """Where FSDP's group spans nodes, --time gives the published ZeRO-3 runs' measured / predicted step
    (estimate.SHARDED_ACROSS_NODES) as the layout's ratio, and --target-tokens sizes the wall time, the units
    and the sentence for a resource application at it, not at the whole table's (far narrower) range; the
    same model on one node keeps the table's."""
    args = ["plan", "--model.size=tiny", "--data.seq_len=64", "--train.micro_batch_size=2", "--site=lumi-g"]
    args += ["--train.global_batch_size=32", "--target-tokens=1e9", "--json"]
    r = exatrain_cli(*args, "--world-size=16", "--parallel.dp_shard=16")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    z = estimate.SHARDED_ACROSS_NODES
    assert plan["published_ratio"] == {
        "runs": z.runs,
        "low": z.low,
        "median": z.median,
        "high": z.high,
        "of": z.of,
    }
    assert plan["wall_time_range_h"] == pytest.approx(
        [plan["wall_time_h"] * z.low, plan["wall_time_h"] * z.high]
    )
    assert plan["cost"]["units_range"] == pytest.approx(
        [plan["cost"]["units"] * z.low, plan["cost"]["units"] * z.high]
    )
    sentence = plan["target"]["sentence"]
    assert (
        f"on 6 published training runs that sharded their parameters over 48 to 280 nodes (ZeRO-3) the "
        f"measured step was {z.low:.2f} to {z.high:.2f} times the predicted one" in sentence
    )
    r = exatrain_cli(*args, "--world-size=8", "--parallel.dp_shard=8")
    assert r.returncode == 0, r.stderr
    one_node = json.loads(r.stdout)
    p = estimate.PUBLISHED
    assert (one_node["published_ratio"]["low"], one_node["published_ratio"]["high"]) == (p.low, p.high)
    assert (
        f"on {p.runs} published training runs the measured step was {p.low:.2f}"
        in one_node["target"]["sentence"]
    )


def test_search_with_a_token_target_gives_each_layout_its_wall_time_and_units(exatrain_cli):
    """`--search --target-tokens N` answers the planning question in one command: every listed layout gets
    its wall time (steps x its predicted step) and billing units (`exatrain cost`'s code for the job's
    nodes), and the fastest one the whole target with its sentence for a resource application; the layouts
    train on the same global batch, so the wall times rank as the step times do."""
    from exatrain.slurm.billing import estimate_cost
    from exatrain.slurm.spec import JobSpec

    args = ["plan", "--model.size=tiny", "--data.seq_len=64", "--site=juwels-booster", "--world-size=8"]
    args += ["--train.global_batch_size=32", "--search", "--top=4", "--target-tokens=1e9"]
    r = exatrain_cli(*args, "--json", timeout=300)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    steps = -(-(10**9) // (32 * 64))
    hourly = estimate_cost(JobSpec(nodes=2, gpus_per_node=4, time="01:00:00"), load_profile("juwels-booster"))
    layouts = result["layouts"]
    assert len(layouts) == 4
    for lay in layouts:
        assert lay["wall_time_h"] == pytest.approx(steps * lay["step_time_s"] / 3600)
        assert lay["units"] == pytest.approx(lay["wall_time_h"] * hourly.units)
    assert [lay["wall_time_h"] for lay in layouts] == sorted(lay["wall_time_h"] for lay in layouts)
    target = result["target"]
    assert target["steps"] == steps and target["wall_time_h"] == layouts[0]["wall_time_h"]
    assert (target["nodes"], target["gpus_per_node"], target["unit"]) == (2, 4, "core-hours")
    assert target["sentence"].startswith("Training a ") and f"{steps:,} steps" in target["sentence"]
    r = exatrain_cli(*args, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("   to 1e+09 tokens: ") == 4
    assert "for a resource application (the fastest layout): Training a " in r.stdout
