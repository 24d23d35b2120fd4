"""`exatrain plan --target-tokens N`: wall time and billing units to train on N tokens (torch-free).

The wall time is the predicted step time (exatrain.tools.plan.estimate) times the steps N tokens take; the
units come from `exatrain cost`'s own code (exatrain.slurm.billing.estimate_cost) for a one-hour job of the
layout's nodes, times the wall time in hours: every billing rule is linear in the hours a job runs, and a
one-hour limit keeps SLURM's rounding to whole minutes out of the product.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from exatrain.errors import ConfigError
from exatrain.slurm.billing import estimate_cost
from exatrain.slurm.profiles import SiteProfile
from exatrain.slurm.spec import JobSpec
from exatrain.slurm.timefmt import parse_slurm_time
from exatrain.tools.plan.estimate import PUBLISHED, PublishedRatio


@dataclass(frozen=True)
class TargetCost:
    """Steps, wall time and billed units to a token target."""

    target_tokens: int
    steps: int
    wall_time_h: float
    wall_time_range_h: tuple[float, float]  # at the published runs' lowest and highest measured/predicted
    nodes: int
    gpus_per_node: int
    units: float
    units_range: tuple[float, float]
    unit: str
    rule: str
    partition: str
    units_per_hour: float
    explanation: str  # the billing arithmetic of one hour, from exatrain.slurm.billing
    jobs: int  # jobs of the partition's maximal time limit needed (1 when the partition has none)
    sentence: str  # for a resource application
    ratio: dict  # the published runs' measured / predicted step the ranges apply (estimate.PublishedRatio)

    def to_dict(self) -> dict:
        return asdict(self)


def num(x: float) -> str:
    """A readable number: thousands separated and one decimal from 10 up, three significant digits below."""
    return f"{x:,.1f}" if x >= 10 else f"{x:.3g}"


def job_shape(world_size: int, profile: SiteProfile) -> tuple[int, int]:
    """(nodes, ranks per node) of a job of `world_size` GPUs that fills whole nodes of the profile."""
    per_node = profile.gpus_per_node or profile.cpu_ranks_per_node
    if world_size <= per_node:
        return 1, world_size
    return world_size // per_node, per_node


def _constants(profile: SiteProfile) -> str:
    """What the prediction's hardware constants are, in the sentence's words ([hardware] source)."""
    source = profile.hardware.source if profile.hardware else ""
    if source == "measured":
        return "hardware constants measured on the site with exatrain doctor"
    if source == "published":
        return "published hardware figures (data sheets and public measurements), not measured on the site"
    return "the site profile's hardware constants"


def target_cost(
    tokens: int,
    tokens_per_step: int,
    step_time_s: float,
    world_size: int,
    profile: SiteProfile,
    what: str,
    ratio: PublishedRatio = PUBLISHED,
) -> TargetCost:
    """Steps, wall time and billing units for `tokens` tokens at the predicted step time, and a sentence
    naming the model (`what`), the hardware and the assumptions, to paste into a resource application;
    the range of both at `ratio`, the published runs' measured / predicted step that applies to the layout
    (estimate.published_ratio)."""
    if tokens < 1:
        raise ConfigError(
            f"--target-tokens must be a positive number of tokens, got {tokens}",
            "pass the training budget in tokens, e.g. --target-tokens 300e9",
        )
    nodes, per_node = job_shape(world_size, profile)
    spec = JobSpec(nodes=nodes, gpus_per_node=per_node, time="01:00:00")
    hourly = estimate_cost(spec, profile)
    steps = math.ceil(tokens / tokens_per_step)
    wall_h = steps * step_time_s / 3600
    units = hourly.units * wall_h
    part = profile.partition_named(hourly.partition)
    limit = parse_slurm_time(part.max_time) if part is not None and part.max_time else None
    jobs = math.ceil(wall_h * 3600 / limit) if limit else 1
    low, high = ratio.low, ratio.high
    sentence = (
        f"Training {what} on {tokens:.3g} tokens ({steps:,} steps of {tokens_per_step:,} tokens) takes "
        f"{num(wall_h)} hours of wall time on {nodes} node(s) x {per_node} GPUs of {profile.name} "
        f"(partition {hourly.partition}) at a predicted {step_time_s:.3g} s per step, i.e. "
        f"{num(units)} {hourly.unit} under the site's {hourly.rule} billing rule. The step time is predicted "
        f"by exatrain plan from {_constants(profile)}; on "
        f"{ratio.runs} {ratio.of} the measured step was {low:.2f} to {high:.2f} times the "
        f"predicted one (median {ratio.median:.2f}), which puts this training at {num(wall_h * low)} to "
        f"{num(wall_h * high)} hours ({num(units * low)} to {num(units * high)} {hourly.unit}). Evaluation, "
        "checkpointing, restarts and queueing are not included, for which a margin should be added."
    )
    return TargetCost(
        target_tokens=tokens,
        steps=steps,
        wall_time_h=wall_h,
        wall_time_range_h=(wall_h * low, wall_h * high),
        nodes=nodes,
        gpus_per_node=per_node,
        units=units,
        units_range=(units * low, units * high),
        unit=hourly.unit,
        rule=hourly.rule,
        partition=hourly.partition,
        units_per_hour=hourly.units,
        explanation=f"({hourly.explanation}) per hour x {num(wall_h)} h = {num(units)} {hourly.unit}",
        jobs=jobs,
        sentence=sentence,
        ratio=asdict(ratio),
    )
