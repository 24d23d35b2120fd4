"""Step time of a layout from hardware constants (torch-free): compute, memory-bound kernels, exposed
communication, bubble, pipeline imbalance, optimizer.

Nothing here is fitted to a measured step: the inputs are the model's FLOPs, the bytes its memory-bound
kernels move (exatrain.tools.plan.traffic), the measured collectives of one step
(exatrain.tools.plan.comm) and the site's [hardware] constants. Formulas and blind spots are
documented in docs/planning.md; the names below follow it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field

from exatrain.errors import ConfigError

TIME_KEYS = ("matmul_tflops", "intra_node_busbw_gbs", "inter_node_busbw_gbs")
# nccl-tests' bus-bandwidth factor per collective kind (PERFORMANCE.md of nccl-tests): busbw = S / t x factor
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}
DATA_PARALLEL = ("dp_replicate", "dp_shard")
ADAMW_BYTES_PER_ELEMENT = 7 * 4  # AdamW reads param, grad, exp_avg, exp_avg_sq and writes three (fp32)
# Bytes per updated parameter element of an optimizer step, by the code that runs it: a fused AdamW on fp32
# parameters and gradients (exatrain's trainer), or Megatron-LM's fp16 optimizer
# (Float16OptimizerWithFloat16Params.step with a loss scale, a published code of docs/plan-validation.md),
# which around the same AdamW copies the fp16 gradients to fp32 main gradients (read 2, write 4), unscales
# them and checks for inf (read 4, write 4), reads them once for the clipping norm (the clip itself runs
# only when the norm exceeds the threshold: not counted) and copies the updated fp32 main parameters back
# to the fp16 model (read 4, write 2)
# DeepSpeed's BF16_Optimizer (BLOOM's and the LUMI runs' code, its own ZeRO-1: the step updates only the
# rank's 1/DP partition of the fp32 master weights) copies its updated partition to the bf16 parameters
# (read 4, write 2, update_lp_params) and then all-gathers them over the data-parallel group (the
# collective: analytic.collectives)
# Composer's DecoupledAdamW (the MPT runs' code) is not fused: per parameter it runs exp_avg.mul_ (read 4,
# write 4), .add_(grad) (8, 4), exp_avg_sq.mul_ (4, 4), .addcmul_(grad, grad) (8, 4: the gradient is one
# tensor, read once), sqrt, a division and .add_(eps) into a new denominator (4, 4 each) and
# param.addcdiv_ (12, 4): 80 bytes per element with weight decay 0, as the MPT yamls set it (below: the two
# mul_, add_ and addcmul_, the denominator, addcdiv_). Composer's gradient clipping calls FSDP1's
# clip_grad_norm_ before it, which reads every gradient shard for the norm (4) and multiplies each by the
# clamped coefficient whatever its value (4, 4)
COMPOSER_ADAMW_BYTES = 2 * 8 + 2 * 12 + 3 * 8 + 16
FSDP1_CLIP_BYTES = 4 + 8
OPTIMIZER_BYTES = {
    "adamw": ADAMW_BYTES_PER_ELEMENT,
    "megatron-fp16": ADAMW_BYTES_PER_ELEMENT + (2 + 4) + (4 + 4) + 4 + (4 + 2),
    "deepspeed-bf16": ADAMW_BYTES_PER_ELEMENT + (4 + 2),
    "composer-adamw": COMPOSER_ADAMW_BYTES + FSDP1_CLIP_BYTES,
}
# Bytes per gradient element of the rank (not only of its partition) an optimizer's step moves besides
# OPTIMIZER_BYTES: DeepSpeed's BF16_Optimizer reads every fp32 gradient for the norm (get_grads_for_norm)
# and zeroes them all after the step (clear_hp_grads)
GRADIENT_BYTES = {"deepspeed-bf16": 4 + 4}
# the optimizers that update only the rank's data-parallel partition and all-gather the parameters after
# the step (ZeRO-1)
PARTITIONED_OPTIMIZERS = ("deepspeed-bf16",)


def optimizer_step_bytes(optimizer: str, local_param_elements: int, partitions: int = 1) -> float:
    """Bytes one rank's optimizer step reads and writes: OPTIMIZER_BYTES per element it updates (its
    1 / `partitions` share under ZeRO-1), GRADIENT_BYTES per gradient element it holds."""
    updated = local_param_elements / partitions
    return updated * OPTIMIZER_BYTES[optimizer] + local_param_elements * GRADIENT_BYTES.get(optimizer, 0)


@dataclass(frozen=True)
class StageLoad:
    """One pipeline rank's own work per step (its stages' blocks, and the embeddings or the head where it
    holds the first or last stage): FLOPs by the rate that runs them, and memory-bound bytes."""

    matmul_flops: float
    attention_flops: float  # the fused attention kernel's (0 when attention is plain matrix products)
    memory_bytes: float
    # the attention's batched products when the scores are kept in memory (materialised): FLOPs and the
    # bytes they move (products_seconds); 0 with the fused kernel
    score_flops: float = 0.0
    score_bytes: float = 0.0


@dataclass(frozen=True)
class StepInputs:
    """What the step-time model needs besides the collectives."""

    world_size: int
    gpus_per_node: int
    flops_per_token: float  # model FLOPs (forward + backward) per token: 6 N + 12 L D T
    tokens_per_step: int  # global batch x sequence length
    recompute_factor: float  # 1 + recomputed forward share (activation checkpointing)
    pp: int
    pp_chunks: int  # stages per pipeline rank (interleaved schedules)
    microbatches: int  # pipeline microbatches per micro-batch (1 without pipeline parallel)
    local_param_elements: int  # parameters one rank updates (optimizer step)
    memory_bytes: float = 0.0  # bytes one rank's memory-bound kernels read and write per step (traffic.py)
    # of flops_per_token, what the fused attention kernel (scaled_dot_product_attention) runs: 12 L D T; 0
    # when the attention products are plain batched matrix products (at matmul_tflops like the rest)
    attention_flops_per_token: float = 0.0
    # of flops_per_token, the attention's batched products when the scores are kept in memory (12 L D T,
    # materialised attention; 0 with the fused kernel), and the bytes the average rank's such products move
    # per step (traffic.score_product_bytes): they run at the slower of the two (products_seconds)
    score_flops_per_token: float = 0.0
    score_bytes: float = 0.0
    # communication runs beside the kernels (GPUs: copy engines and NCCL's own SMs); False on CPU nodes,
    # where the same cores compute and communicate, so every collective adds to the step
    overlap: bool = True
    # each pipeline rank's own work (workload.stage_loads); empty without pipeline parallel
    stages: tuple[StageLoad, ...] = ()
    accumulation: int = 1  # micro-batches per step (gradient accumulation; each one pipeline flush)
    # the gradients are reduced after the step's whole backward, beside no kernel: not exatrain's trainer
    # (it overlaps the last backward), but validation runs whose code did that (Megatron-LM's local DDP,
    # DeepSpeed's pipeline engine)
    reduce_after_backward: bool = False
    optimizer: str = "adamw"  # whose optimizer step (OPTIMIZER_BYTES)
    optimizer_partitions: int = 1  # the data-parallel ranks a ZeRO-1 optimizer splits its update over


@dataclass(frozen=True)
class PublishedRatio:
    """Measured over predicted step time on the published GPU runs of docs/plan-validation.md: where real
    steps have fallen around the prediction, for a user who sizes an allocation on it. Not applied to the
    prediction (nothing is fitted); tests/unit/test_plan_validation.py recomputes it from the table."""

    runs: int
    low: float
    median: float
    high: float
    of: str = "published training runs"  # which runs, in a sentence's words


PUBLISHED = PublishedRatio(runs=27, low=0.97, median=1.14, high=1.61)
# the same ratio on the published runs that sharded their parameters over many nodes (ZeRO-3 over 48 to 280
# nodes, docs/plan-validation.md "Runs left out"; tests/unit/test_plan_validation_readings.py recomputes it):
# far slower than the model, which hides FSDP's gathers
SHARDED_ACROSS_NODES = PublishedRatio(
    runs=6,
    low=1.70,
    median=2.69,
    high=5.55,
    of="published training runs that sharded their parameters over 48 to 280 nodes (ZeRO-3)",
)


def _nodes(shard_ranks, gpus_per_node: int) -> int:
    """How many nodes an FSDP group spans (ranks fill nodes in order; a CPU profile is one node)."""
    return len({r // gpus_per_node for r in shard_ranks}) if gpus_per_node else 1


def published_ratio(shard_ranks, gpus_per_node: int) -> PublishedRatio:
    """The published runs' measured / predicted step that applies to a layout (`shard_ranks`: rank 0's FSDP
    group, empty without FSDP): the ZeRO-3 runs' where its parameters are sharded over several nodes (the
    model hides those gathers, which the published runs at that scale do not bear out), else the table's."""
    return SHARDED_ACROSS_NODES if _nodes(shard_ranks, gpus_per_node) > 1 else PUBLISHED


def sharding_note(shard_ranks, gpus_per_node: int) -> str | None:
    """A warning for a layout whose parameters are sharded over several nodes (`shard_ranks`: rank 0's FSDP
    group): the model takes the gathers as hidden behind the compute, which no published run at that scale
    bears out, so a search must not be trusted to rank such layouts by their predicted step."""
    nodes = _nodes(shard_ranks, gpus_per_node)
    if nodes < 2:
        return None
    r = SHARDED_ACROSS_NODES
    return (
        f"parameters sharded over {nodes} nodes: the model hides FSDP's gathers behind the compute, which is "
        f"not validated across nodes; the {r.runs} published ZeRO-3 runs read (48 to 280 nodes) took "
        f"{r.low:.2f} to {r.high:.2f} x the model's step (docs/plan-validation.md, 'Runs left out')"
    )


@dataclass(frozen=True)
class StepTime:
    step_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float | None
    # compute, memory-bound kernels, exposed communication, bubble, pipeline imbalance, optimizer (seconds)
    breakdown: dict
    comm_s: dict  # "kind over dim" -> seconds of that collective if not overlapped
    published_ratio: dict = field(default_factory=lambda: asdict(PUBLISHED))
    constants: str = ""  # the [hardware] table's source: "published", "measured" or "" (not said)

    def to_dict(self) -> dict:
        return asdict(self)


def check_hardware(hardware, site: str, world_size: int, gpus_per_node: int):
    """The [hardware] table of a profile, or a ConfigError naming the keys a step time needs. A job on one
    node needs no inter-node bandwidth (none of its collectives crosses nodes), and a job of one rank no
    bandwidth at all (it issues no collective), so the table that `exatrain doctor` prints on one node, or
    on one GPU, is enough for it."""
    nodes = -(-world_size // gpus_per_node) if gpus_per_node else 1  # a CPU profile: one node
    unused = {"inter_node_busbw_gbs"} if nodes == 1 else set()
    if world_size == 1:
        unused.add("intra_node_busbw_gbs")
    needed = tuple(k for k in TIME_KEYS if k not in unused)
    missing = list(needed) if hardware is None else hardware.missing(needed)
    if missing:
        where = "has no [hardware] table" if hardware is None else f"[hardware] lacks {', '.join(missing)}"
        keys = " = ..., ".join(missing)
        raise ConfigError(
            f"--time needs measured hardware constants, but site profile {site!r} {where}",
            "measure them with `exatrain doctor` on the site's nodes (it prints the [hardware] lines to "
            "paste; for CPU runs `exatrain doctor --device cpu --nproc N`), add [hardware] "
            f"{keys} = ... to a copy of the profile and pass its path with --site (docs/planning.md)",
        )
    return hardware


def constants_note(source: str) -> str:
    """One sentence on where the [hardware] constants come from, so a prediction made from a bundled profile's
    published figures is never read as one made from this machine's measurements."""
    if source == "measured":
        return 'hardware constants: measured (source = "measured": exatrain doctor on the machine)'
    if source == "published":
        return (
            'hardware constants: PUBLISHED figures (source = "published": data sheets and public '
            "measurements, cited in the site profile), not measured on your allocation; measure them with "
            "`exatrain doctor` there and pass a profile with its [hardware] lines (docs/planning.md)"
        )
    return (
        "hardware constants: the profile's [hardware] table does not say where they come from "
        '(source = "measured" or "published")'
    )


def collective_seconds(
    kind: str,
    nbytes: int,
    group_size: int,
    crosses_nodes: bool,
    hw,
    node_share: float = 1.0,
    calls: int = 1,
) -> float:
    """nccl-tests' model of one collective: S x busbw factor / busbw of the links its group crosses
    (send/recv and broadcast: factor 1), `nbytes` the S of `calls` calls together. `node_share`: the part of
    a node's inter-node links this group gets (node_links_share); nccl-tests' busbw across nodes is that of
    a group holding whole nodes. With a measured busbw curve the calls run at its busbw at their mean size."""
    if group_size <= 1 or nbytes == 0:
        return 0.0
    busbw = bus_bandwidth(hw, crosses_nodes, nbytes / max(1, calls)) * 1e9
    if crosses_nodes:
        busbw *= node_share
    return nbytes * BUS_FACTOR.get(kind, lambda n: 1.0)(group_size) / busbw


def bus_bandwidth(hw, crosses_nodes: bool, size: float) -> float:
    """The busbw (GB/s) of one call of `size` bytes: the profile's curve at that size where it has one
    (nccl-tests' all-reduce busbw by message size: small messages are bound by latency, not by the links),
    else its one figure, which is a large message's."""
    curve = hw.inter_node_busbw_curve if crosses_nodes else hw.intra_node_busbw_curve
    if not curve:
        return hw.inter_node_busbw_gbs if crosses_nodes else hw.intra_node_busbw_gbs
    return curve_at(curve, size)


def curve_at(curve, size: float) -> float:
    """A [(bytes, value), ...] table at `size`: linear in log size between its points, its first and last
    value beyond them (no extrapolation)."""
    if size <= curve[0][0]:
        return curve[0][1]
    for (s0, v0), (s1, v1) in zip(curve, curve[1:]):
        if size <= s1:
            return v0 + (v1 - v0) * math.log(size / s0) / math.log(s1 / s0)
    return curve[-1][1]


def node_links_share(ranks, gpus_per_node: int) -> float:
    """The share of a node's inter-node links one group crossing nodes gets: k / gpus_per_node, with k its
    fewest ranks on one node. Every rank of a node runs its own group of the same mesh dimension at the
    same time (data-parallel all-reduces, pipeline sends: all ranks step together), so the node's
    gpus_per_node / k such groups share its NICs; a group of whole nodes (what nccl-tests' busbw across
    nodes measures) has them all. Ranks fill nodes in order, as SLURM's block distribution places them."""
    return min(Counter(r // gpus_per_node for r in ranks).values()) / gpus_per_node


def step_time(inputs: StepInputs, collectives, hw) -> StepTime:
    """Predict one step: compute + memory-bound kernels + exposed communication + pipeline bubble + optimizer
    (docs/planning.md). The memory-bound kernels (normalisation, activation, residual adds, casts, the loss)
    are separate kernels from the matrix products: their time adds to the compute, it does not overlap."""
    compute = compute_seconds(inputs, hw)
    comm = {}
    exposed_dp = exposed_other = 0.0
    dp_total = reductions = 0.0
    for c in collectives:
        crosses = len({r // inputs.gpus_per_node for r in c.ranks}) > 1  # ranks fill nodes in order
        share = node_links_share(c.ranks, inputs.gpus_per_node) if crosses else 1.0
        t = collective_seconds(c.kind, c.bytes, c.group_size, crosses, hw, share, c.count)
        comm[f"{c.kind} over {c.dim}"] = t
        if inputs.optimizer_partitions > 1 and c.kind == "all_gather" and c.dim == "dp_replicate":
            # a ZeRO-1 optimizer's gather of the updated parameters (analytic.collectives adds it for such an
            # optimizer), after the step: beside no kernel
            exposed_other += t
        elif inputs.overlap and set(c.dim.split("+")) <= set(DATA_PARALLEL):
            dp_total += t
            if c.kind != "all_gather":  # the gradients' all-reduce / reduce-scatter (FSDP gathers parameters)
                reductions += t
        else:  # tensor parallel (and anything else, and everything on CPU nodes) is in the critical path
            exposed_other += t
    memory = memory_seconds(inputs.memory_bytes, hw)
    optimizer = memory_seconds(
        optimizer_step_bytes(inputs.optimizer, inputs.local_param_elements, inputs.optimizer_partitions), hw
    )
    kernels = compute + memory  # the forward's and backward's kernels, one after the other
    # data-parallel traffic runs beside the kernels: FSDP's prefetched all-gathers beside every forward and
    # backward, the gradients' reduction (DDP's buckets, FSDP's reduce-scatters) only beside the last
    # backward of the step; what the kernels cannot hide is exposed
    window = 0.0 if inputs.reduce_after_backward else reduction_window(inputs, kernels)
    exposed_dp = max(0.0, dp_total - kernels, reductions - window)
    bubble = imbalance = 0.0
    if inputs.pp > 1:
        bubble = kernels * (inputs.pp - 1) / (inputs.microbatches * inputs.pp_chunks)
        imbalance = pipeline_imbalance(inputs, hw)
    total = kernels + exposed_dp + exposed_other + bubble + imbalance + optimizer
    tflops = inputs.flops_per_token * inputs.tokens_per_step / total / inputs.world_size / 1e12
    return StepTime(
        step_time_s=total,
        tokens_per_s=inputs.tokens_per_step / total,
        tflops_per_gpu=tflops,
        mfu=tflops / hw.peak_tflops if hw.peak_tflops else None,
        breakdown={
            "compute_s": compute,
            "memory_bound_s": memory,
            "exposed_comm_s": exposed_dp + exposed_other,
            "bubble_s": bubble,
            "pipeline_imbalance_s": imbalance,
            "optimizer_s": optimizer,
        },
        comm_s=comm,
        constants=hw.source,
    )


def reduction_window(inputs: StepInputs, kernels: float) -> float:
    """The kernel time the gradients' reduction can hide behind: the backward of the step's last micro-batch
    (or pipeline microbatch). Gradient accumulation runs the earlier ones without synchronising (DDP's
    no_sync, FSDP's set_requires_gradient_sync(False), the pipeline schedules' last-backward rule), and a
    gradient is reduced only once its backward has produced it. Of a micro-batch's kernels the backward is
    1 - 1 / (3 r): 4 of the 6 FLOPs per parameter and token, plus a recomputed forward's 2 (r, the
    recompute factor); memory-bound kernels are taken to split alike."""
    per_micro = kernels / (inputs.accumulation * inputs.microbatches)
    return per_micro * (1 - 1 / (3 * inputs.recompute_factor))


def pipeline_imbalance(inputs: StepInputs, hw) -> float:
    """What a pipeline loses to its slowest rank: (slowest - average rank's kernel time) x (1 - 1 / (m v)).

    In a pipeline of p ranks, m microbatches and v stages per rank, the slowest rank runs its m
    microbatches back to back and the others add their fill and drain: step = t_max + (sum of t_r - t_max)
    / (m v), with t_r a rank's kernel time per step. With equal ranks that is the average t plus the
    bubble, t (p - 1) / (m v); the rest, (t_max - t_avg) (1 - 1 / (m v)), is the imbalance: the first
    rank's embeddings, the last rank's head and loss, and stages with one block more than others."""
    if not inputs.stages:
        return 0.0
    times = [stage_seconds(s, hw) for s in inputs.stages]
    slowest, average = max(times), sum(times) / len(times)
    return (slowest - average) * (1 - 1 / (inputs.microbatches * inputs.pp_chunks))


def stage_seconds(load: StageLoad, hw) -> float:
    """One pipeline rank's kernel time per step: its products at their rates, its memory-bound bytes at
    HBM bandwidth (none when the profile has no hbm_gbs, as for the step's memory-bound term)."""
    products = flops_seconds(load.matmul_flops, load.attention_flops, hw)
    products += products_seconds(load.score_flops, load.score_bytes, hw)
    return products + memory_seconds(load.memory_bytes, hw)


def flops_seconds(matmul_flops: float, attention_flops: float, hw) -> float:
    """FLOPs over the rates that run them: matrix products at `matmul_tflops`, the fused attention kernel at
    `attention_tflops` (its own measured rate: flash attention runs below the best matrix product, more so
    at small head dimensions; `matmul_tflops` when not given)."""
    attention_rate = hw.attention_tflops or hw.matmul_tflops
    return (matmul_flops / hw.matmul_tflops + attention_flops / attention_rate) / 1e12


def products_seconds(flops: float, nbytes: float, hw) -> float:
    """Matrix products that move many bytes per FLOP (the materialised attention's, whose T x T operand or
    output is d_head elements deep): the slower of their FLOPs at `matmul_tflops` and their bytes at
    `hbm_gbs`, the roofline. A kernel can run no faster than either; at the A100's 268 TF/s and 1.7 TB/s a
    16-bit product below 158 FLOPs per byte (d_head of about 128 and less) is bound by its bytes."""
    return max(flops / (hw.matmul_tflops * 1e12), memory_seconds(nbytes, hw))


def memory_seconds(nbytes: float, hw) -> float:
    """Bytes read and written at `hbm_gbs`; 0 when the profile has none (the plan's note says so)."""
    return nbytes / (hw.hbm_gbs * 1e9) if hw.hbm_gbs else 0.0


def compute_seconds(inputs: StepInputs, hw) -> float:
    """The FLOPs of the average rank's step (recomputation included) over the rates that run them
    (flops_seconds; the materialised attention's products at their roofline, products_seconds)."""
    tokens = inputs.tokens_per_step * inputs.recompute_factor / inputs.world_size
    attention, scores = inputs.attention_flops_per_token, inputs.score_flops_per_token
    products = flops_seconds((inputs.flops_per_token - attention - scores) * tokens, attention * tokens, hw)
    return products + products_seconds(scores * tokens, inputs.score_bytes, hw)


def recompute_factor(ac: str, every: int) -> float:
    """Hardware FLOPs / model FLOPs: a recomputed forward adds 2 of the 6 FLOPs per parameter and token."""
    if ac == "full":
        return 4 / 3
    if ac == "every":
        return 1 + 1 / (3 * every)
    return 1.0
