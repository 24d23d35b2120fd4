"""Estimate what a job costs under the site profile's billing rules, with advice on wasteful requests.

Estimates use the time limit (an upper bound: sites charge the time actually used). Never imports torch.
Rule kinds (parameters live in the profile's ``[[billing]]`` tables):

- ``whole-node`` (LUMI standard-g; JSC in core-hours): units = nodes x hours x units_per_node_hour, whatever
  the job uses.
- ``gpu-slot`` (LUMI small-g, dev-g): for the whole job, charged GPUs = max(GPUs, ceil(cores / cores_per_gpu),
  ceil(memory GB / mem_gb_per_gpu)) (cores and memory in whole slots); units = charged GPUs x hours x
  units_per_gpu_hour.
- ``gpu-hours``: units = nodes x GPUs per node x hours x units_per_gpu_hour.
- ``core-hours``: units = nodes x ranks per node x cores per rank x hours x units_per_core_hour.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from exatrain.errors import ConfigError
from exatrain.slurm.profiles import BillingRule, SiteProfile
from exatrain.slurm.spec import JobSpec


@dataclass(frozen=True)
class CostEstimate:
    """The estimated charge of one job."""

    units: float  # billed units for the whole time limit
    unit: str  # e.g. "GPU-hours"
    rule: str  # rule kind used
    partition: str  # partition the rule was chosen for
    explanation: str  # the arithmetic, for humans
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
    raise ConfigError(
        f"profile {profile.name!r} has no billing rule for partition {partition!r}",
        f"use one of {', '.join(named)} or add a [[billing]] table for it to the profile",
    )


def estimate_cost(spec: JobSpec, profile: SiteProfile) -> CostEstimate:
    """Cost of ``spec`` on ``profile`` for its full time limit, with advice where a request wastes units."""
    spec.check_against(profile)
    partition = spec.partition or profile.partition
    rule = find_rule(profile, partition)
    units, text = _charge(spec, profile, rule)
    advice = _advice(spec, profile, rule, units)
    return CostEstimate(
        round(units, 6), rule.unit, rule.rule, partition, f"{text} = {units:g} {rule.unit}", advice
    )


def _charge(spec: JobSpec, profile: SiteProfile, rule: BillingRule) -> tuple[float, str]:
    """(units, the arithmetic) of one rule."""
    hours = spec.minutes() / 60
    gpus, cpus, mem = spec.ranks_per_node(profile), spec.cpus(profile), spec.mem_gb(profile)
    head = f"{spec.nodes} node(s) x {hours:g} h"
    if rule.rule == "whole-node":
        return (
            spec.nodes * hours * rule.units_per_node_hour,
            f"{head} x {rule.units_per_node_hour:g} {rule.unit} per node-hour (whole nodes)",
        )
    if rule.rule == "gpu-slot":
        all_gpus, cores, memory = spec.nodes * gpus, spec.nodes * gpus * cpus, spec.nodes * gpus * mem
        charged = max(
            all_gpus, math.ceil(cores / rule.cores_per_gpu), math.ceil(memory / rule.mem_gb_per_gpu)
        )
        return (
            charged * hours * rule.units_per_gpu_hour,
            f"{hours:g} h x max({all_gpus} GPUs, ceil({cores} cores / {rule.cores_per_gpu}), "
            f"ceil({memory} GB / "
            f"{rule.mem_gb_per_gpu:g})) = {charged} charged GPUs x {rule.units_per_gpu_hour:g} "
            f"{rule.unit} per GPU-hour",
        )
    if rule.rule == "gpu-hours":
        return (
            spec.nodes * gpus * hours * rule.units_per_gpu_hour,
            f"{head} x {gpus} GPUs x {rule.units_per_gpu_hour:g} {rule.unit} per GPU-hour",
        )
    return (
        spec.nodes * gpus * cpus * hours * rule.units_per_core_hour,
        f"{head} x {gpus} ranks x {cpus} cores x {rule.units_per_core_hour:g} {rule.unit} per core-hour",
    )


def _advice(spec: JobSpec, profile: SiteProfile, rule: BillingRule, units: float) -> tuple[str, ...]:
    gpus, partition = spec.ranks_per_node(profile), spec.partition or profile.partition
    advice = []
    if rule.rule == "whole-node" and profile.gpus_per_node and gpus < profile.gpus_per_node:
        cheaper = _cheaper_partition(spec, profile, units)
        where = (
            f"or partition {cheaper[0]!r}, which bills only what the job asks for ({cheaper[1]:g} "
            f"{rule.unit})"
            if cheaper
            else "no partition of this profile bills less than whole nodes"
        )
        advice.append(
            f"{partition} charges whole nodes but the job uses {gpus} of {profile.gpus_per_node} "
            "GPUs per node: "
            f"use all {profile.gpus_per_node}, {where}"
        )
    if rule.rule == "gpu-slot":
        charged = units / (spec.minutes() / 60) / rule.units_per_gpu_hour
        if charged > spec.nodes * gpus:
            slots = {
                "cores": math.ceil(spec.nodes * gpus * spec.cpus(profile) / rule.cores_per_gpu),
                "memory": math.ceil(spec.nodes * gpus * spec.mem_gb(profile) / rule.mem_gb_per_gpu),
            }
            what = max(slots, key=slots.get)
            advice.append(
                f"the request is charged as {charged:g} GPUs for {spec.nodes * gpus} used, because of its "
                f"{what}: {profile.default_cpus_per_gpu} cores and "
                f"{profile.default_mem_per_gpu_gb or int(rule.mem_gb_per_gpu)} GB per GPU fit in one (set "
                "job.cpus_per_task and job.mem_per_gpu_gb to 0 for those defaults)"
            )
    return tuple(advice)


def _cheaper_partition(spec: JobSpec, profile: SiteProfile, units: float) -> tuple[str, float] | None:
    """A described partition that allocates by resources, admits the job and costs less: (name, units)."""
    for part in profile.partitions:
        if part.whole_nodes:
            continue
        other = dataclasses.replace(spec, partition=part.name)
        try:
            other.check_against(profile)
            cost, _ = _charge(other, profile, find_rule(profile, part.name))
        except ConfigError:
            continue
        if cost < units:
            return part.name, cost
    return None
