"""Billing estimates against hand-computed values of the profile rules (arithmetic in the comments)."""

import pytest

from exatrain.errors import ConfigError
from exatrain.slurm import JobSpec, estimate_cost, load_profile

CASES = [
    # standard-g, whole nodes: 2 nodes x 2 h x 4 GPU-hours per node-hour = 16
    ("lumi-g", dict(nodes=2, time="02:00:00"), 16.0, "whole-node", ""),
    # standard-g with 4 of 8 GCDs: still whole nodes: 1 x 0.5 h x 4 = 2; advice: uses 4 of 8
    ("lumi-g", dict(gpus_per_node=4, time="30"), 2.0, "whole-node", "uses 4 of 8 GPUs"),
    # small-g, 1 GCD with 16 cores: max(1, 16/8 = 2, 60/64 = 0.9375) = 2 GCDs x 1 h x 0.5 = 1.0
    (
        "lumi-g",
        dict(partition="small-g", gpus_per_node=1, cpus_per_task=16, time="60"),
        1.0,
        "gpu-slot",
        "7 cores and 60 GB per GPU fit in one",
    ),
    # small-g, 2 GCDs with defaults (7 cores, 60 GB each):
    # max(2, 14/8 = 1.75, 120/64 = 1.875) = 2 x 3 h x 0.5 = 3.0
    ("lumi-g", dict(partition="small-g", gpus_per_node=2, time="03:00:00"), 3.0, "gpu-slot", ""),
    # dev-g, 1 GCD with 128 GB: max(1, 7/8, 128/64 = 2) = 2 x 1.5 h x 0.5 = 1.5 (memory)
    (
        "lumi-g",
        dict(partition="dev-g", gpus_per_node=1, mem_per_gpu_gb=128, time="01:30:00"),
        1.5,
        "gpu-slot",
        "because of its memory",
    ),
    # small-g, 2 full nodes: max(8, 56/8 = 7, 480/64 = 7.5) = 8 per node x 2 nodes x 4 h x 0.5 = 32
    ("lumi-g", dict(partition="small-g", nodes=2, time="04:00:00"), 32.0, "gpu-slot", ""),
    # generic-nvidia: 3 nodes x 4 GPUs x 24 h x 1 = 288 GPU-hours
    ("generic-nvidia", dict(nodes=3, time="1-00:00:00"), 288.0, "gpu-hours", ""),
    # juwels-booster: JSC bills core-hours of whole nodes: 1
    # node x 48 cores x 0.25 h = 12, though 2 of 4 GPUs are used
    ("juwels-booster", dict(gpus_per_node=2, time="15"), 12.0, "whole-node", "uses 2 of 4 GPUs"),
    # jureca-dc: 2 nodes x 128 cores x 3 h = 768 core-hours
    ("jureca-dc", dict(nodes=2, time="03:00:00"), 768.0, "whole-node", ""),
    # small-g slots (LUMI billing policy): 1 GCD, 9 cores: max(1,
    # ceil(9/8) = 2, ceil(60/64) = 1) = 2 x 1 h x 0.5 = 1.0
    (
        "lumi-g",
        dict(partition="small-g", gpus_per_node=1, cpus_per_task=9, time="60"),
        1.0,
        "gpu-slot",
        "because of its cores",
    ),
    # 3 GCDs x 70 GB = 210 GB: max(3, ceil(21/8) = 3, ceil(210/64) = 4) = 4 x 2 h x 0.5 = 4.0
    (
        "lumi-g",
        dict(partition="small-g", gpus_per_node=3, mem_per_gpu_gb=70, time="02:00:00"),
        4.0,
        "gpu-slot",
        "because of its memory",
    ),
    # 2 nodes x 3 GCDs x 7 cores = 42 cores, 360 GB: max(6,
    # ceil(42/8) = 6, ceil(360/64) = 6) = 6 x 1 h x 0.5 = 3.0
    ("lumi-g", dict(partition="small-g", nodes=2, gpus_per_node=3, time="60"), 3.0, "gpu-slot", ""),
    # cpu: 2 nodes x 4 ranks x 8 cores x 0.75 h x 1 = 48 core-hours
    ("cpu", dict(nodes=2, gpus_per_node=4, cpus_per_task=8, time="45"), 48.0, "core-hours", ""),
]


@pytest.mark.parametrize(("profile", "spec", "units", "rule", "advice"), CASES)
def test_cost(profile, spec, units, rule, advice):
    cost = estimate_cost(JobSpec(**spec), load_profile(profile))
    assert cost.units == pytest.approx(units)
    assert cost.rule == rule
    assert f"= {units:g} " in cost.explanation
    if advice:
        assert any(advice in a for a in cost.advice), cost.advice
    else:
        assert cost.advice == ()


def test_partition_without_rule_is_refused():
    with pytest.raises(ConfigError, match="no billing rule for partition 'standard'") as exc:
        estimate_cost(JobSpec(partition="standard"), load_profile("lumi-g"))
    assert "small-g" in exc.value.hint


def test_sub_node_job_on_a_whole_node_partition_is_pointed_to_a_shared_one():
    """2 GCDs on standard-g for 1 h: 4 GPU-hours (a whole node); on small-g: max(2, ceil(14/8) = 2,
    ceil(120/64) = 2) x 0.5 = 1 GPU-hour."""
    cost = estimate_cost(JobSpec(gpus_per_node=2, time="60"), load_profile("lumi-g"))
    assert cost.units == 4.0
    assert any("partition 'small-g'" in a and "(1 GPU-hours)" in a for a in cost.advice), cost.advice


def test_no_shared_partition_is_suggested_where_the_job_does_not_fit_it():
    """small-g admits 4 nodes and dev-g 3 hours: a 6-node, 4-hour half-node job has nowhere cheaper to go."""
    cost = estimate_cost(JobSpec(nodes=6, gpus_per_node=4, time="04:00:00"), load_profile("lumi-g"))
    assert any("no partition of this profile bills less" in a for a in cost.advice), cost.advice


def test_cli_cost_prints_the_advice(tmp_path, capsys):
    from exatrain.cli.main import main

    cfg = tmp_path / "job.toml"
    cfg.write_text('[job]\nprofile = "lumi-g"\ngpus_per_node = 2\ntime = "60"\n')
    assert main(["cost", "-c", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("4 GPU-hours on standard-g")
    assert "ADVICE: standard-g charges whole nodes" in out and "'small-g'" in out


@pytest.mark.parametrize(
    ("spec", "match", "hint"),
    [
        (dict(partition="small-g", nodes=5), "exceeds the 4 nodes", "at most 4 nodes"),
        (dict(partition="dev-g", time="04:00:00"), "exceeds the 03:00:00 limit", "at most 03:00:00"),
        (dict(time="3-00:00:00"), "exceeds the 2-00:00:00 limit of partition 'standard-g'", "resume"),
        (dict(mem_per_gpu_gb=70), "560 GB per node exceed the 480 GB", "mem_per_gpu_gb <= 60"),
        (dict(nodes=2000), "exceeds the 1024 nodes", "small-g"),
    ],
)
def test_partition_limits_are_checked_with_a_hint(spec, match, hint):
    with pytest.raises(ConfigError, match=match) as exc:
        estimate_cost(JobSpec(**spec), load_profile("lumi-g"))
    assert hint in exc.value.hint
