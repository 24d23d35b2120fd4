"""Render a Plan: a rich table on a terminal (rich prints plain lines when stdout is not a tty), or JSON."""

from __future__ import annotations

import json

from exatrain.tools.plan.estimate import constants_note
from exatrain.tools.plan.memory import gib, over
from exatrain.tools.plan.planner import Plan
from exatrain.tools.plan.target import num

ROWS = (  # (label, RankPlan attribute)
    ("parameters", "params"),
    ("gradients", "grads"),
    ("optimizer (AdamW)", "optimizer"),
    ("FSDP/DDP buffers", "transient"),
    ("bf16 weight copies", "weight_copies"),
    ("activations / microbatch", "activation_per_microbatch"),
    ("activations (in flight)", "activations"),
    ("total per GPU", "total"),
)


DOES_NOT_FIT_HINT = (
    "shard the model over more ranks (--parallel.dp_shard=N, --parallel.tp=N or --parallel.pp=N), recompute "
    "activations (--parallel.activation_checkpoint=full), lower --train.micro_batch_size, or let "
    "`exatrain plan --search` find the fastest layout that fits"
)

NO_SENTENCE = "none: this layout does not fit the GPU's memory (see the HINT)"


def fits(plan: Plan) -> bool:
    """False when the largest rank is over the GPU's memory; True when it fits, is tight or is unknown."""
    return not over(plan.peak.total, plan.gpu_memory_gb)


def to_json(plan: Plan) -> str:
    return json.dumps(plan.to_dict(), indent=2)


def print_plan(plan: Plan) -> None:
    """The layout, a column per representative rank, the verdict and the assumptions."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:  # a file or pipe: one line per line, however long (rich would wrap at 80)
        console = Console(width=100_000, soft_wrap=True)
    console.print(
        f"layout: {plan.layout}, world size {plan.world_size:,}; vocabulary {plan.vocab_size:,}, "
        f"{plan.batch_per_microbatch} x {plan.seq_len} tokens per microbatch "
        f"(checked in {plan.elapsed_s:.1f} s)"
    )
    table = Table(title="memory per GPU (rank 0 of each pipeline rank's group)")
    table.add_column("")
    for r in plan.ranks:
        table.add_column(
            f"rank {r.rank}\nstage {', '.join(map(str, r.stages))}, {sum(r.blocks)} blocks", justify="right"
        )
    for label, attr in ROWS:
        table.add_row(label, *(gib(getattr(r, attr)) for r in plan.ranks))
    table.add_row("microbatches in flight", *(str(r.microbatches_in_flight) for r in plan.ranks))
    console.print(table)
    console.print(f"verdict: {plan.peak.verdict} (largest: rank {plan.peak.rank}, {gib(plan.peak.total)})")
    if not fits(plan):
        console.print(f"HINT: {DOES_NOT_FIT_HINT}", highlight=False, markup=False)
    if plan.comm:
        comm = Table(title="communication per step (rank 0)")
        for name in ("collective", "calls", "bytes (nccl-tests S)"):
            comm.add_column(name, justify="left" if name == "collective" else "right")
        for name, row in plan.comm.items():
            comm.add_row(f"{name} ({row['group_size']} ranks)", str(row["count"]), gib(row["bytes"]))
        console.print(comm)
    if plan.time:
        t = plan.time
        parts = ", ".join(f"{k[:-2].replace('_', ' ')} {v * 1e3:.2f} ms" for k, v in t["breakdown"].items())
        mfu = f", MFU {t['mfu']:.1%}" if t["mfu"] is not None else ""
        console.print(
            f"predicted step: {t['step_time_s'] * 1e3:.2f} ms ({parts}); "
            f"{t['tokens_per_s']:,.0f} tokens/s, {t['tflops_per_gpu']:.1f} TFLOP/s per GPU{mfu}",
            highlight=False,
        )
        r = t["published_ratio"]
        console.print(
            f"  the {r['runs']} {r['of']} took {r['low']:.2f}-{r['high']:.2f} x the model's step (median "
            f"{r['median']:.2f} x, docs/plan-validation.md): "
            f"{t['step_time_s'] * r['low'] * 1e3:.2f}-{t['step_time_s'] * r['high'] * 1e3:.2f} ms here",
            highlight=False,
        )
    if plan.target:
        t = plan.target
        console.print(
            f"to {t['target_tokens']:.3g} tokens: {t['steps']:,} steps, {num(t['wall_time_h'])} h wall time "
            f"({t['jobs']} job(s) of the partition's time limit), {num(t['units'])} {t['unit']}; "
            f"at the published runs' ratios {num(t['wall_time_range_h'][0])}-"
            f"{num(t['wall_time_range_h'][1])} h, {num(t['units_range'][0])}-{num(t['units_range'][1])} "
            f"{t['unit']}",
            highlight=False,
        )
        console.print(f"  {t['explanation']}", highlight=False, markup=False)
        sentence = t["sentence"] if fits(plan) else NO_SENTENCE
        console.print(f"for a resource application: {sentence}", highlight=False, markup=False)
    for note in plan.assumptions:
        console.print(f"  - {note}", highlight=False, markup=False)


def print_search(result) -> None:
    """The fastest layouts of `exatrain plan --search`, each with the options that select it and why."""
    print(
        f"{result.considered:,} valid layouts for {result.world_size:,} ranks, {result.dropped_for_memory:,} "
        f"dropped for memory, searched in {result.elapsed_s:.1f} s; the fastest {len(result.layouts)}:"
    )
    for i, lay in enumerate(result.layouts, 1):
        mfu = f", MFU {lay.mfu:.1%}" if lay.mfu is not None else ""
        print(
            f"{i}. {lay.step_time_s * 1e3:,.1f} ms per step, {lay.tokens_per_s:,.0f} tokens/s, "
            f"{lay.tflops_per_gpu:.1f} TFLOP/s per GPU{mfu}, {gib(lay.memory_bytes)} per GPU"
        )
        _print_layout_details(lay, result.target)
    _print_fastest_validated(result)
    print(
        "  - PREDICTIONS of the step-time model (docs/planning.md); memory and collectives counted in closed "
        "form (exatrain/tools/plan/analytic.py); check the chosen layout with `exatrain plan` and its options"
    )
    print(f"  - {constants_note(result.constants)}")
    if result.target:
        t = result.target
        print(
            f"  - to {t['target_tokens']:.3g} tokens: {t['steps']:,} steps of {t['nodes']} node(s) x "
            f"{t['gpus_per_node']} GPUs, billed ({t['rule']} rule, partition {t['partition']}) "
            f"{num(t['units_per_hour'])} {t['unit']} per hour; the fastest layout at the {t['ratio']['of']}' "
            f"ratios: {num(t['wall_time_range_h'][0])}-{num(t['wall_time_range_h'][1])} h, "
            f"{num(t['units_range'][0])}-{num(t['units_range'][1])} {t['unit']}"
        )
        print(f"for a resource application (the fastest layout): {t['sentence']}")
    if result.fastest_validated_target:
        print(
            f"for a resource application (#{result.fastest_validated_rank:,}, the fastest layout that keeps "
            f"its parameters within a node): {result.fastest_validated_target['sentence']}"
        )


def _print_fastest_validated(result) -> None:
    """Where the fastest layout shards its parameters over nodes (a prediction the validation table does
    not cover): the fastest layout that keeps them within a node, with its options where the list leaves it
    out."""
    first = result.layouts[0]
    if first.validated:
        return
    lay, k = result.fastest_validated, result.fastest_validated_rank
    if lay is None:
        print(
            "no layout that fits keeps its parameters within a node: this ranking rests on the model's FSDP "
            "gathers across nodes, which no published run bears out (docs/plan-validation.md, 'Runs left "
            "out')"
        )
        return
    slower, r = lay.step_time_s / first.step_time_s - 1, lay.published_ratio
    print(
        f"the fastest layout that keeps its parameters within a node (the kind the validation table covers) "
        f"is #{k:,}: {lay.step_time_s * 1e3:,.1f} ms per step, {slower:+.1%} over #1 by the model; on the "
        f"{r['runs']} {r['of']} the measured step was {r['low']:.2f}-{r['high']:.2f} x such a prediction"
    )
    if k > len(result.layouts):
        _print_layout_details(lay, result.target)


def _print_layout_details(lay, target: dict | None) -> None:
    """A searched layout's options, why, and with --target-tokens its wall time and billing units."""
    print(f"   {lay.overrides}")
    print(f"   why: {lay.why}")
    if target:
        print(
            f"   to {target['target_tokens']:.3g} tokens: {num(lay.wall_time_h)} h wall time, "
            f"{num(lay.units)} {target['unit']}"
        )
