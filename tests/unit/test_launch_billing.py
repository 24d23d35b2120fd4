"""Billing estimates against hand-computed values of the profile rules (arithmetic in the comments)."""

import pytest

from exatrain.errors import ConfigError
from exatrain.launch import JobSpec, estimate_cost, load_profile

CASES = [
    # standard-g, whole nodes: 2 nodes x 2 h x 4 GPU-hours per node-hour = 16
    ("lumi-g", dict(nodes=2, time="02:00:00"), 16.0, "whole-node", ""),
    # standard-g with 4 of 8 GCDs: still whole nodes: 1 x 0.5 h x 4 = 2; advice: uses 4 of 8
    ("lumi-g", dict(gpus_per_node=4, time="30"), 2.0, "whole-node", "uses 4 of 8 GPUs"),
    # small-g, 1 GCD with 16 cores: max(1, 16/8 = 2, 60/64 = 0.9375) = 2 GCDs x 1 h x 0.5 = 1.0
    ("lumi-g", dict(partition="small-g", gpus_per_node=1, cpus_per_task=16, time="60"), 1.0, "gpu-slot",
     "7 cores and 60 GB per GPU fit in one"),
    # small-g, 2 GCDs with defaults (7 cores, 60 GB each): max(2, 14/8 = 1.75, 120/64 = 1.875) = 2 x 3 h x 0.5 = 3.0
    ("lumi-g", dict(partition="small-g", gpus_per_node=2, time="03:00:00"), 3.0, "gpu-slot", ""),
    # dev-g, 1 GCD with 128 GB: max(1, 7/8, 128/64 = 2) = 2 x 1.5 h x 0.5 = 1.5 (memory)
    ("lumi-g", dict(partition="dev-g", gpus_per_node=1, mem_per_gpu_gb=128, time="01:30:00"), 1.5, "gpu-slot",
     "because of its memory"),
    # small-g, 2 full nodes: max(8, 56/8 = 7, 480/64 = 7.5) = 8 per node x 2 nodes x 4 h x 0.5 = 32
    ("lumi-g", dict(partition="small-g", nodes=2, time="04:00:00"), 32.0, "gpu-slot", ""),
    # generic-nvidia: 3 nodes x 4 GPUs x 24 h x 1 = 288 GPU-hours
    ("generic-nvidia", dict(nodes=3, time="1-00:00:00"), 288.0, "gpu-hours", ""),
    # juwels-booster: 1 node x 2 GPUs x 0.25 h x 1 = 0.5
    ("juwels-booster", dict(gpus_per_node=2, time="15"), 0.5, "gpu-hours", ""),
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
