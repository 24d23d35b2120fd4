"""Estimate what a job costs under the site profile's billing rules, with advice on wasteful requests.

Estimates use the time limit (an upper bound: sites charge the time actually used). Never imports torch.
Rule kinds (parameters live in the profile's ``[[billing]]`` tables):

- ``whole-node`` (LUMI standard-g): units = nodes x hours x units_per_node_hour, whatever the job uses.
- ``gpu-slot`` (LUMI small-g, dev-g): per node, charged GPUs = max(GPUs, cores / cores_per_gpu,
  memory GB / mem_gb_per_gpu) (fractions kept); units = nodes x charged GPUs x hours x units_per_gpu_hour.
- ``gpu-hours``: units = nodes x GPUs per node x hours x units_per_gpu_hour.
- ``core-hours``: units = nodes x ranks per node x cores per rank x hours x units_per_core_hour.
"""

from __future__ import annotations

from dataclasses import dataclass

from exatrain.errors import ConfigError
from exatrain.launch.profiles import BillingRule, SiteProfile
from exatrain.launch.spec import JobSpec


@dataclass(frozen=True)
class CostEstimate:
    """The estimated charge of one job."""

    units: float          # billed units for the whole time limit
    unit: str             # e.g. "GPU-hours"
    rule: str             # rule kind used
    partition: str        # partition the rule was chosen for
    explanation: str      # the arithmetic, for humans
    advice: tuple[str, ...] = ()


def find_rule(profile: SiteProfile, partition: str) -> BillingRule:
    """The partition's own rule, else the profile's catch-all rule (empty partitions list)."""
    for rule in profile.billing:
        if partition in rule.partitions:
            return rule
    for rule in profile.billing:
        if not rule.partitions:
            return rule
    named = sorted(p for r in profile.billing for p in r.partitions)
    raise ConfigError(f"profile {profile.name!r} has no billing rule for partition {partition!r}",
                      f"use one of {', '.join(named)} or add a [[billing]] table for it to the profile")


def estimate_cost(spec: JobSpec, profile: SiteProfile) -> CostEstimate:
    """Cost of ``spec`` on ``profile`` for its full time limit."""
    spec.check_against(profile)
    partition = spec.partition or profile.partition
    rule = find_rule(profile, partition)
    hours = spec.minutes() / 60
    gpus, cpus, mem = spec.ranks_per_node(profile), spec.cpus(profile), spec.mem_gb(profile)
    head = f"{spec.nodes} node(s) x {hours:g} h"
    advice: list[str] = []
    if rule.rule == "whole-node":
        units = spec.nodes * hours * rule.units_per_node_hour
        text = f"{head} x {rule.units_per_node_hour:g} {rule.unit} per node-hour (whole nodes)"
        if profile.gpus_per_node and gpus < profile.gpus_per_node:
            advice.append(f"{partition} charges whole nodes but the job uses {gpus} of {profile.gpus_per_node} GPUs "
                          f"per node: use all {profile.gpus_per_node}, or a partition billed per GPU")
    elif rule.rule == "gpu-slot":
        by_cores = gpus * cpus / rule.cores_per_gpu
        by_mem = gpus * mem / rule.mem_gb_per_gpu
        charged = max(gpus, by_cores, by_mem)
        units = spec.nodes * charged * hours * rule.units_per_gpu_hour
        text = (f"{head} x max({gpus} GPUs, {gpus * cpus} cores / {rule.cores_per_gpu}, {gpus * mem} GB / "
                f"{rule.mem_gb_per_gpu:g}) = {charged:g} charged GPUs x {rule.units_per_gpu_hour:g} {rule.unit} per GPU-hour")
        if charged > gpus:
            what = "cores" if by_cores >= by_mem else "memory"
            advice.append(f"the request is charged as {charged:g} GPUs per node for {gpus} used, because of its {what}: "
                          f"{profile.default_cpus_per_gpu} cores and {profile.default_mem_per_gpu_gb or int(rule.mem_gb_per_gpu)} GB "
                          f"per GPU fit in one (set job.cpus_per_task and job.mem_per_gpu_gb to 0 for those defaults)")
    elif rule.rule == "gpu-hours":
        units = spec.nodes * gpus * hours * rule.units_per_gpu_hour
        text = f"{head} x {gpus} GPUs x {rule.units_per_gpu_hour:g} {rule.unit} per GPU-hour"
    else:  # core-hours
        units = spec.nodes * gpus * cpus * hours * rule.units_per_core_hour
        text = f"{head} x {gpus} ranks x {cpus} cores x {rule.units_per_core_hour:g} {rule.unit} per core-hour"
    return CostEstimate(round(units, 6), rule.unit, rule.rule, partition, f"{text} = {units:g} {rule.unit}", tuple(advice))
