"""`exatrain plan --search`: every valid layout for the world size, ranked by predicted step time.

Enumerates the degrees (dp_replicate x dp_shard x tp x pp = world size; tp within a node and dividing the
heads; pp dividing the blocks), the micro batch (dividing the batch per data-parallel rank), activation
checkpointing (none, full) and for pp > 1 the schedule (1f1b, gpipe, interleaved_1f1b with 2 stages per
rank; one sample per pipeline microbatch). Each candidate goes through the trainer's own checks
(train.preflight), gets its memory from the plan's own arithmetic (planner.rank_plan) on shards counted in
closed form (analytic.py: the same counts as the measured shards, checked by tests), and its step time
from estimate.step_time on closed-form collectives. Those that do not fit the GPU are dropped.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from exatrain.config import Config
from exatrain.errors import ConfigError
from exatrain.models import configured_shape
from exatrain.tools.plan import analytic, estimate, memory
from exatrain.tools.plan.planner import activation_spec, published_ratio, rank_plan, sharding_note
from exatrain.tools.plan.workload import Code, analytic_model, own_code, step_inputs, step_shape
from exatrain.train.preflight import preflight

SCHEDULES = (("1f1b", 1), ("gpipe", 1), ("interleaved_1f1b", 2))
AC_MODES = ("none", "full")


@dataclass(frozen=True)
class Layout:
    """One ranked candidate."""

    degrees: dict
    micro_batch_size: int
    activation_checkpoint: str
    pp_schedule: str | None
    pp_stages_per_rank: int
    pp_microbatches: int
    memory_bytes: int  # the largest rank's total (planner.rank_plan)
    verdict: str
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float | None
    breakdown: dict
    why: str
    overrides: str  # the command-line keys that select this layout
    published_ratio: dict  # estimate.published_ratio: where real steps fell around such a prediction
    # its parameters stay within a node (no FSDP group spans nodes): the kind of layout whose prediction the
    # validation table covers; the others rest on the model's hidden FSDP gathers across nodes
    validated: bool
    wall_time_h: float | None = None  # with --target-tokens: to the target at the predicted step time
    units: float | None = None  # with --target-tokens: billing units for that wall time

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SearchResult:
    world_size: int
    considered: int  # candidates that passed the trainer's checks
    dropped_for_memory: int
    layouts: list[Layout]  # the best `top`, fastest first
    elapsed_s: float
    constants: str = ""  # the [hardware] table's source (profiles.Hardware.source)
    target: dict | None = None  # with --target-tokens: the fastest layout's target.TargetCost
    # where the fastest layout is not `validated`: the fastest that is, and its place in the whole ranking
    fastest_validated: Layout | None = None
    fastest_validated_rank: int | None = None
    fastest_validated_target: dict | None = None  # with --target-tokens: its target.TargetCost

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def candidates(cfg: Config, world_size: int, gpus_per_node: int):
    """Configs of every layout to try (the trainer's checks still apply)."""
    shape = configured_shape(cfg.model)
    gb, p = cfg.train.global_batch_size, cfg.parallel
    for tp in divisors(world_size):
        if tp > max(1, gpus_per_node) or shape.n_heads % tp:  # TP across nodes is never the fast choice
            continue
        for pp in divisors(world_size // tp):
            dp = world_size // (tp * pp)
            if pp > shape.n_layers or gb % dp:
                continue
            for shard in divisors(dp):
                for mb in divisors(gb // dp):
                    for ac in AC_MODES:
                        for schedule, chunks in SCHEDULES if pp > 1 else ((p.pp_schedule, 1),):
                            # uneven splits are valid: their slowest stage is priced (pipeline_imbalance_s)
                            if pp * chunks > shape.n_layers:
                                continue
                            parallel = dataclasses.replace(
                                p,
                                dp_replicate=dp // shard,
                                dp_shard=shard,
                                tp=tp,
                                pp=pp,
                                sequence_parallel=tp > 1,
                                loss_parallel=p.loss_parallel and tp > 1,
                                param_dtype=p.param_dtype if shard > 1 else "fp32",
                                cpu_offload=False,
                                pp_schedule=schedule,
                                pp_stages_per_rank=chunks,
                                pp_microbatches=mb if pp > 1 else 0,
                                activation_checkpoint=ac,
                            )
                            train = dataclasses.replace(cfg.train, micro_batch_size=mb)
                            yield dataclasses.replace(cfg, parallel=parallel, train=train)


def search(
    cfg: Config,
    world_size: int,
    vocab: int,
    hardware,
    gpus_per_node: int,
    gpu_gb: float | None,
    top: int = 10,
) -> SearchResult:
    """Rank the valid layouts of `cfg`'s model for `world_size` ranks by predicted step time."""
    t0 = time.perf_counter()
    per_node = gpus_per_node or world_size
    considered = dropped = 0
    ranked: list[Layout] = []
    smallest: Layout | None = None  # the dropped layout with the least memory, for the error below
    params = total_params(cfg, vocab)
    code = own_code(gpus_per_node)
    for cand in candidates(cfg, world_size, per_node):
        try:
            dims = preflight(cand, world_size)
        except ConfigError:
            continue
        considered += 1
        layout = evaluate(cand, dims, vocab, hardware, gpus_per_node, gpu_gb, params, code)
        if memory.over(layout.memory_bytes, gpu_gb):
            dropped += 1
            smallest = layout if smallest is None else min(smallest, layout, key=_footprint)
            continue
        ranked.append(layout)
    if not considered:
        raise ConfigError(
            f"no layout of this model fits the trainer's checks on {world_size} ranks",
            "raise train.global_batch_size (each data-parallel rank needs a sample, a pipeline rank's "
            "micro batch at least pp samples) to a multiple of a large power of two, or check that "
            "model.n_heads divides by the tensor-parallel degrees you expect",
        )
    if not ranked:
        raise nothing_fits(smallest, considered, world_size, gpu_gb, params)
    ranked.sort(key=lambda x: (x.step_time_s, x.memory_bytes))  # ties: the smaller footprint first
    rank, validated = _fastest_validated(ranked)
    elapsed = time.perf_counter() - t0
    return SearchResult(
        world_size,
        considered,
        dropped,
        ranked[:top],
        elapsed,
        hardware.source,
        fastest_validated=validated,
        fastest_validated_rank=rank,
    )


def _fastest_validated(ranked: list[Layout]) -> tuple[int | None, Layout | None]:
    """Where the fastest layout shards its parameters over nodes (a prediction no published run bears out,
    estimate.sharding_note): the fastest layout that keeps them within a node, and its 1-based place in the
    ranking; (None, None) where the fastest is such a layout already, or none is."""
    if ranked[0].validated:
        return None, None
    return next(((i, x) for i, x in enumerate(ranked, 1) if x.validated), (None, None))


def _footprint(layout: Layout) -> tuple[int, float]:
    """Order of the smallest layout: memory, then step time."""
    return layout.memory_bytes, layout.step_time_s


def nothing_fits(smallest: Layout, considered: int, world_size: int, gpu_gb: float, params: int):
    """The error of a search whose every valid layout is over the GPU's memory: the smallest one, and the
    GPUs that the weights, gradients and AdamW state alone would need (16 bytes per parameter)."""
    state = params * (4 + 4 + memory.ADAMW_STATE_BYTES)  # fp32 weights and gradients, AdamW's moments
    at_least = max(world_size + 1, -(-state // (gpu_gb * memory.GIB)))
    need, weights = memory.gib(smallest.memory_bytes), memory.gib(state)
    return ConfigError(
        f"no layout of this model fits {world_size:,} GPUs of {gpu_gb:g} GiB: all {considered:,} valid "
        f"layouts are over the GPU's memory; the smallest needs {need} per GPU ({smallest.overrides})",
        f"give the job more GPUs (its fp32 weights, gradients and AdamW state alone are {weights}, at least "
        f"{at_least:,.0f} GPUs of {gpu_gb:g} GiB before activations), shorten --data.seq_len, or plan a "
        "smaller model",
    )


def total_params(cfg: Config, vocab: int) -> int:
    """Parameters of the whole model, counted from its tensors (analytic._tensors with tp = 1)."""
    m = analytic.Model(configured_shape(cfg.model), vocab, cfg.data.seq_len, 4, 4)
    return sum(r * c for r, c in analytic._tensors(m, 1, True, True, m.shape.n_layers))


def model_of(cfg: Config, vocab: int, code: Code = Code()) -> analytic.Model:
    """The analytic model of `cfg` and `code` (workload.analytic_model)."""
    return analytic_model(cfg, vocab, code)


def evaluate(
    cfg: Config,
    dims,
    vocab: int,
    hardware,
    gpus_per_node: int,
    gpu_gb,
    params: int,
    code: Code = Code(),
) -> Layout:
    """Memory (largest rank) and predicted step time of one checked layout (`gpus_per_node` 0: a CPU node;
    `code`: what the ranks run, workload.Code: exatrain's own trainer by default)."""
    p, t = cfg.parallel, cfg.train
    m = model_of(cfg, vocab, code)
    chunks = p.pp_stages_per_rank if dims.pp_enabled else 1
    spec = activation_spec(cfg, dims, vocab)
    pp_ranks = sorted(
        {0, dims.pp - 1}
    )  # rank 0 holds most microbatches and the embeddings; the last the head
    shards = [analytic.rank_shards(m, dims, chunks, r) for r in pp_ranks]
    plans = [rank_plan(s, cfg, dims, spec, gpu_gb) for s in shards]
    peak = max(plans, key=lambda r: r.total)
    micro = dims.microbatches(p) if dims.pp_enabled else 1
    step = step_shape(cfg, dims)
    comm = analytic.collectives(m, dims, step, shards[0])
    local = max(s.param_elements for s in shards)
    inputs = step_inputs(cfg, dims, vocab, params, gpus_per_node, local, code)
    st = estimate.step_time(inputs, comm, hardware)
    sharded = sharding_note(dims, gpus_per_node)
    return Layout(
        degrees=dims.degrees(),
        micro_batch_size=t.micro_batch_size,
        activation_checkpoint=p.activation_checkpoint,
        pp_schedule=p.pp_schedule if dims.pp_enabled else None,
        pp_stages_per_rank=chunks,
        pp_microbatches=micro if dims.pp_enabled else 0,
        memory_bytes=peak.total,
        verdict=peak.verdict,
        step_time_s=st.step_time_s,
        tokens_per_s=st.tokens_per_s,
        tflops_per_gpu=st.tflops_per_gpu,
        mfu=st.mfu,
        breakdown=st.breakdown,
        why=_why(peak, st, sharded),
        overrides=_overrides(cfg, dims),
        published_ratio=published_ratio(dims, gpus_per_node),
        validated=sharded is None,
    )


def _why(peak, st: estimate.StepTime, sharded: str | None) -> str:
    """Memory, where the step's time goes, and a warning where the prediction is not validated (`sharded`:
    the layout's planner.sharding_note)."""
    total = st.step_time_s
    b = st.breakdown
    worst = max(st.comm_s.items(), key=lambda kv: kv[1], default=None)
    comm = f" (largest: {worst[0]})" if worst and b["exposed_comm_s"] > 0 else ""
    why = (
        f"memory {peak.total / memory.GIB:.1f} GiB, {peak.verdict}; compute {b['compute_s'] / total:.0%}, "
        f"memory-bound kernels {b['memory_bound_s'] / total:.0%}, "
        f"exposed communication {b['exposed_comm_s'] / total:.0%}{comm}, bubble {b['bubble_s'] / total:.0%}, "
        f"stage imbalance {b['pipeline_imbalance_s'] / total:.0%}, optimizer {b['optimizer_s'] / total:.0%}"
    )
    return f"{why}; {sharded}" if sharded else why


def _overrides(cfg: Config, dims) -> str:
    """The --section.key=value options that select this layout."""
    p = cfg.parallel
    keys = [f"--parallel.{k}={v}" for k, v in dims.degrees().items()]
    keys += [f"--train.micro_batch_size={cfg.train.micro_batch_size}"]
    keys += [f"--parallel.activation_checkpoint={p.activation_checkpoint}"]
    if dims.tp_enabled:  # the layout's own choice (the search's layouts shard the sequence, a plan may not)
        keys += [f"--parallel.sequence_parallel={str(p.sequence_parallel).lower()}"]
    if p.param_dtype != cfg.parallel.param_dtype or dims.fsdp:
        keys += [f"--parallel.param_dtype={p.param_dtype}"]
    if dims.pp_enabled:
        keys += [
            f"--parallel.pp_schedule={p.pp_schedule}",
            f"--parallel.pp_stages_per_rank={p.pp_stages_per_rank}",
            f"--parallel.pp_microbatches={p.pp_microbatches}",
        ]
    return " ".join(keys)
