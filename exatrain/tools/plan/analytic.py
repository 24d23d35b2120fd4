"""Closed-form shards and collectives of a layout, for `exatrain plan --search` (microseconds; no tensors:
FSDP inside an interleaved schedule asks torch's schedule for the rank's order of actions, nothing more).

`exatrain plan` MEASURES one layout: its shards on the meta device (layout.py) and its collectives on fake
tensors (comm.py), which takes seconds per layout. A search over thousands of layouts of 16,384 ranks
cannot do that, so it counts the same things from the model's shape and the tensor-parallel plan
(models/tp_plan.py): the same parameter tensors, split as the layout splits them, and the collectives a
step issues. `tests/unit/test_plan_search.py` checks the result against the measured plan on a few layouts
(docs/planning.md gives the tolerance and what the closed form leaves out).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from exatrain.distributed.parallel_dims import ParallelDims
from exatrain.models import ModelShape
from exatrain.tools.plan.comm import Collective
from exatrain.tools.plan.layout import RankShards


@dataclass(frozen=True)
class Model:
    """What the closed forms need of the model and the batch."""

    shape: ModelShape
    vocab: int
    seq_len: int
    elem_bytes: int  # activations (2 = bf16, 4 = fp32)
    param_bytes: int  # FSDP's param_dtype (the all-gathered copies)
    # the residual stream's and the norms' outputs' elements and their gradients' (tensor-parallel
    # reductions, pipeline sends): 4 under autocast with fp32 weights (exatrain); 2 where a run's code keeps
    # 16-bit weights (workload.Code.weights_16bit)
    residual_bytes: int = 4
    grad_bytes: int = 4  # the data-parallel reduction's gradient elements (workload.Code)
    # how a run's code sends between pipeline stages (PIPELINE_SENDS; workload.Code.pipeline_sends)
    pipeline_sends: str = "whole"
    # a ZeRO-1 optimizer (DeepSpeed's BF16_Optimizer) all-gathers the updated 16-bit parameters over the
    # data-parallel group after the step (workload.Code.optimizer)
    gather_after_step: bool = False

    def __post_init__(self):
        if self.pipeline_sends not in PIPELINE_SENDS:
            raise ValueError(f"pipeline_sends {self.pipeline_sends!r} is not one of {PIPELINE_SENDS}")


# Pipeline sends under tensor parallelism: every tensor-parallel rank sends the whole tensor (torch's
# pipelining, exatrain's trainer); each sends its 1/tp and the receivers all-gather it (Megatron-LM's
# scatter/gather optimization); or so, and the sender also keeps only its 1/tp of what it sent and gathers
# it again for the backward (DeepSpeed's pipeline engine with tensor parallelism: PartitionedTensor)
PIPELINE_SENDS = ("whole", "scatter_gather", "partitioned")


def _tensors(m: Model, tp: int, first: bool, last: bool, n_blocks: int) -> list[tuple[int, int]]:
    """(rows, columns) of one stage's parameter tensors after tensor parallel (rows first: FSDP's dim 0)."""
    d, hidden = m.shape.dim, m.shape.dim * m.shape.mlp_ratio
    block = [(d, 1), (d, 1)]  # the two norms (replicated under TP)
    block += [(d // tp, d)] * 3 + [(d, d // tp)]  # wq, wk, wv column-wise, wo row-wise
    block += [(hidden // tp, d), (d, hidden // tp)]  # w1 column-wise, w2 row-wise
    out = block * n_blocks
    if first:  # embedding tables split by rows
        out += [(math.ceil(m.vocab / tp), d), (math.ceil(m.seq_len / tp), d)]
    if last:  # final norm, output head column-wise (rows = vocabulary)
        out += [(d, 1), (math.ceil(m.vocab / tp), d)]
    return out


DDP_BUCKET_CAPS = (1024**2, 25 * 1024**2)  # torch DDP: its first bucket's cap, then bucket_cap_mb's default


def ddp_buckets(m: Model, shards: RankShards) -> int:
    """How many all-reduces torch's DDP issues per step for this rank's gradients (pure replication: with TP
    or PP exatrain syncs them otherwise). Its reducer rebuilds the buckets in the order the gradients became
    ready in a backward (the head and final norm, the blocks from the last, each from w2 back, then the
    embeddings) and fills each until it reaches its cap (_compute_bucket_assignment_by_size:
    1 MiB the first, 25 MiB the others). A row's busbw is that of its mean call size (estimate.bus_bandwidth),
    so the count matters where the profile has a busbw curve."""
    # each group of tensors in reverse of the model's order (_tensors lists blocks, tables, then the head)
    head = _tensors(m, 1, False, shards.last, 0)[::-1]
    blocks = _tensors(m, 1, False, False, sum(shards.blocks))[::-1]
    tables = _tensors(m, 1, shards.first, False, 0)[::-1]
    count, filled = 0, 0
    for rows, cols in head + blocks + tables:
        filled += rows * cols * m.grad_bytes
        if filled >= DDP_BUCKET_CAPS[min(count, 1)]:
            count, filled = count + 1, 0
    return count + (1 if filled else 0)


def _shard(rows: int, cols: int, n: int) -> int:
    """Elements rank 0 holds of a (rows, cols) tensor split along dim 0 into n (FSDP2: ceil)."""
    return math.ceil(rows / n) * cols


def rank_shards(m: Model, dims: ParallelDims, chunks: int, pp_rank: int) -> RankShards:
    """The shards of rank 0 of `pp_rank`'s group, as exatrain.tools.plan.layout measures them."""
    from exatrain.distributed.pipeline import stage_ids
    from exatrain.models.pipeline_split import stage_layer_ranges

    n_stages = dims.pp * chunks
    stages = tuple(stage_ids(pp_rank, dims.pp, chunks))
    layers = [len(r) for r in stage_layer_ranges(m.shape.n_layers, n_stages)]  # the trainer's split
    s = dims.dp_shard if dims.fsdp else 1
    elements = tensors = 0
    units = []
    grad_extra = 0
    for stage in stages:
        first, last = stage == 0, stage == n_stages - 1
        block = _tensors(m, dims.tp, False, False, 1)
        units += [sum(r * c for r, c in block) * 4] * layers[stage]
        outer = [t for t in _tensors(m, dims.tp, first, last, 0)]
        if outer:
            units.append(sum(r * c for r, c in outer) * 4)
        for r, c in block * layers[stage] + outer:
            elements += _shard(r, c, s)
            tensors += 1
        measured_grads = not (dims.fsdp or (dims.pp > 1 and dims.ddp))  # as layout.meta_grad_bytes
        if first and dims.tp > 1 and measured_grads:  # TP returns the embeddings' gradients whole
            whole = m.vocab - math.ceil(m.vocab / dims.tp) + m.seq_len - math.ceil(m.seq_len / dims.tp)
            grad_extra += whole * m.shape.dim * 4
    fsdp_units = units if dims.fsdp else [0]
    return RankShards(
        rank=pp_rank * (dims.world_size // dims.pp),
        pp_rank=pp_rank,
        stages=stages,
        blocks=tuple(layers[stage] for stage in stages),
        first=0 in stages,
        last=n_stages - 1 in stages,
        param_elements=elements,
        param_tensors=tensors,
        param_bytes=elements * 4,
        grad_bytes=elements * 4 + grad_extra,
        largest_unit_bytes=max(fsdp_units),
        all_units_bytes=sum(fsdp_units),
    )


@dataclass(frozen=True)
class StepShape:
    """How one step runs: the layout's batch split."""

    accumulation: int  # micro-batches per step (gradient accumulation)
    microbatches: int  # pipeline microbatches per micro-batch (1 without PP)
    batch: int  # samples per pipeline microbatch
    chunks: int  # model chunks per pipeline rank
    sequence_parallel: bool
    loss_parallel: bool
    recompute: bool  # activation checkpointing re-runs forward collectives in backward


def _group(dims: ParallelDims, name: str) -> tuple[int, ...]:
    """The ranks of rank 0's group over `name` (mesh order pp, dp_replicate, dp_shard, tp): estimate.py
    tells from them whether the group crosses nodes and how many of its ranks share a node."""
    stride = {"tp": 1, "dp_shard": dims.tp, "dp_replicate": dims.tp * dims.dp_shard}
    stride["pp"] = stride["dp_replicate"] * dims.dp_replicate
    return tuple(range(0, stride[name] * getattr(dims, name), stride[name]))


def shard_group(dims: ParallelDims) -> tuple[int, ...]:
    """The ranks of rank 0's FSDP group (its dp_shard dimension)."""
    return _group(dims, "dp_shard")


def collectives(m: Model, dims: ParallelDims, step: StepShape, shards: RankShards) -> list[Collective]:
    """Rank 0's collectives of one step in closed form (bytes = nccl-tests' S, as comm.py records them).

    Tensor parallel under bf16 autocast: the norms' outputs and the residual stream are fp32 (4 bytes), the
    linear layers' outputs `elem_bytes`; per block and pass, forward reduces wo's and w2's outputs and
    (sequence parallel) gathers the two norm outputs; backward does the converse with the gradients' dtypes.
    """
    rows: dict[tuple[str, str], list[float]] = {}

    def add(kind: str, dim: str, count: float, nbytes: float) -> None:
        if count and nbytes and getattr(dims, dim) > 1:
            row = rows.setdefault((kind, dim), [0, 0])
            row[0] += count
            row[1] += nbytes

    micro = step.accumulation * step.microbatches  # pipeline microbatches of the step
    btd = step.batch * m.seq_len * m.shape.dim  # elements of one microbatch's hidden states
    e = m.elem_bytes
    if dims.tp > 1:
        _tensor_parallel(add, micro, btd, e, m, step, shards)
    # FSDP gathers parameters in their dtype: every unit of this rank, and one block
    units = shards.all_units_bytes * m.param_bytes // 4
    block = sum(r * c for r, c in _tensors(m, dims.tp, False, False, 1)) * m.param_bytes
    if dims.fsdp and dims.pp > 1 and step.chunks == 1:
        _fsdp_in_pipeline(add, step, shards, units, block)
    elif dims.fsdp and dims.pp > 1:
        _fsdp_interleaved(add, dims, step, shards, units, block, m.param_bytes)
    elif dims.fsdp:
        n_units = sum(shards.blocks) + 1  # the blocks and the root (embeddings, norm, head)
        add("all_gather", "dp_shard", n_units * step.accumulation, units * step.accumulation)  # forward
        # backward gathers again all but the last block (FSDP keeps the last one unsharded after forward)
        add("all_gather", "dp_shard", (n_units - 1) * step.accumulation, (units - block) * step.accumulation)
        add("reduce_scatter", "dp_shard", n_units, shards.all_units_bytes)
    if dims.dp_replicate > 1:  # DDP's buckets, or HSDP's all-reduce of the reduced shards (one per unit)
        if dims.fsdp:
            count = sum(shards.blocks) + 1
        elif dims.tp > 1 or dims.pp > 1:  # one all-reduce of all gradients (TP replicas' sync, pipelines)
            count = 1
        else:
            count = ddp_buckets(m, shards)
        grads = shards.grad_bytes or shards.param_elements * 4
        add("all_reduce", "dp_replicate", count, grads * m.grad_bytes // 4)
        if m.gather_after_step:  # S: every parameter element of the rank, in bf16 (update_lp_params)
            add("all_gather", "dp_replicate", 1, shards.param_elements * 2)
    if dims.pp > 1:
        # the hidden states between stages are the residual stream: fp32 under bf16 autocast (fp32
        # parameters, fp32 residual adds), FSDP's param_dtype where FSDP casts the parameters
        hidden = m.param_bytes if dims.fsdp else m.residual_bytes
        act = btd * hidden / (dims.tp if step.sequence_parallel else 1)
        edges = 2 * step.chunks - 1  # stage 0 sends forward / receives backward once; later chunks both ways
        if m.pipeline_sends != "whole" and dims.tp > 1 and not step.sequence_parallel:
            # each tensor-parallel rank sends its 1/tp of the replicated tensor; the receivers gather it,
            # and DeepSpeed's engine gathers each output it sent again before that output's backward
            gathers = micro * edges * (2 if m.pipeline_sends == "partitioned" else 1)
            add("all_gather", "tp", gathers, act * gathers)
            act /= dims.tp
        add("send", "pp", micro * edges, act * micro * edges)
        add("recv", "pp", micro * edges, act * micro * edges)
    return [
        Collective(kind, dim, getattr(dims, dim), int(c), int(b), _group(dims, dim))
        for (kind, dim), (c, b) in rows.items()
    ]


def _fsdp_in_pipeline(add, step: StepShape, shards: RankShards, units: int, block: int) -> None:
    """The FSDP rows of `collectives` for a one-chunk pipeline schedule (GPipe, 1F1B), per micro-batch of
    gradient accumulation (each is one schedule step). torch's pipeline stage runs every backward with
    `reshard_after_backward=False` and reduces once after the last one, so a unit that reshards after
    forward (the root and every block but the last) is gathered by the first forward, and again by every
    operation that follows a forward (each forward reshards it, each backward leaves it gathered): with the
    schedule ending on a backward, 1 + microbatches times. The last block, kept after forward, is gathered
    once. Every unit reduce-scatters once per schedule step. A stage without embeddings or head has an
    empty root, which communicates nothing. `units`, `block`: gathered bytes of all units, of one block."""
    root = units - sum(shards.blocks) * block
    resharding = sum(shards.blocks) - 1 + (1 if root else 0)
    times, acc = 1 + step.microbatches, step.accumulation
    add("all_gather", "dp_shard", (resharding * times + 1) * acc, ((units - block) * times + block) * acc)
    add("reduce_scatter", "dp_shard", (resharding + 1) * acc, shards.all_units_bytes * acc)


def _fsdp_interleaved(
    add, dims: ParallelDims, step: StepShape, shards: RankShards, units: int, block: int, param_bytes: int
) -> None:
    """The FSDP rows of `collectives` for an interleaved schedule (several stages per rank), by walking the
    rank's action list as torch lowers it (`schedule_actions.rank_actions`): its UNSHARD of a whole stage
    gathers every sharded unit of it, RESHARD drops them, a forward gathers what is sharded and reshards
    the units that reshard after forward (the root and every block but the stage's last), a backward
    gathers what is sharded and keeps it, and REDUCE_GRAD (after a stage's last backward) reduce-scatters
    every unit and reshards it. Per micro-batch of gradient accumulation (each is one schedule step)."""
    from exatrain.tools.plan.schedule_actions import rank_actions

    per_stage = dict(zip(shards.stages, shards.blocks))  # blocks of each of the rank's stages
    roots = _stage_roots(shards, units, block)
    gathered: dict[tuple[int, int], bool] = {}
    count = nbytes = reduces = reduced = 0

    def stage_units(stage: int):
        """(unit, gathered bytes, fp32 bytes, reshards after forward) of one stage's non-empty units."""
        n = per_stage[stage]
        out = [((stage, i), block, block * 4 // param_bytes, i < n - 1) for i in range(n)]
        if roots[stage]:
            out.append(((stage, -1), roots[stage], roots[stage] * 4 // param_bytes, True))
        return out

    def gather(stage: int) -> None:
        nonlocal count, nbytes
        for unit, size, _, _ in stage_units(stage):
            if not gathered.get(unit):
                count, nbytes = count + 1, nbytes + size
                gathered[unit] = True

    for kind, stage in rank_actions(dims.pp, step.chunks, step.microbatches, shards.pp_rank):
        if kind in ("UNSHARD", "FORWARD", "FULL_BACKWARD"):
            gather(stage)
        if kind == "FORWARD":
            for unit, _, _, reshards in stage_units(stage):
                gathered[unit] = gathered[unit] and not reshards
        elif kind == "RESHARD":
            for unit, _, _, _ in stage_units(stage):
                gathered[unit] = False
        elif kind == "REDUCE_GRAD":
            for unit, _, full, _ in stage_units(stage):
                reduces, reduced = reduces + 1, reduced + full
                gathered[unit] = False
    acc = step.accumulation
    add("all_gather", "dp_shard", count * acc, nbytes * acc)
    add("reduce_scatter", "dp_shard", reduces * acc, reduced * acc)


def _stage_roots(shards: RankShards, units: int, block: int) -> dict[int, int]:
    """Gathered bytes of the root unit of each of the rank's stages: the embeddings on stage 0, the final
    norm and head on the last stage, nothing in between (with pp > 1 no rank holds both)."""
    roots = dict.fromkeys(shards.stages, 0)
    if shards.first or shards.last:
        roots[min(shards.stages) if shards.first else max(shards.stages)] = units - sum(shards.blocks) * block
    return roots


def _tensor_parallel(
    add, micro: int, btd: int, e: int, m: Model, step: StepShape, shards: RankShards
) -> None:
    """The TP rows of `collectives` (norm outputs, residual and their gradients: m.residual_bytes, 4 under
    autocast; linear outputs: e)."""
    blocks = sum(shards.blocks) * micro
    fwd = 2 if step.recompute else 1  # a recomputed forward repeats the forward's collectives
    pos = m.seq_len * m.shape.dim / btd  # the position table's output is T x D, not B x T x D
    r = m.residual_bytes
    if step.sequence_parallel:
        add("all_gather", "tp", blocks * 2 * (fwd + 1), btd * blocks * (2 * r * fwd + 2 * e))
        add("reduce_scatter", "tp", blocks * 2 * (fwd + 1), btd * blocks * (2 * e * fwd + 2 * r))
        if shards.first:  # the embeddings' partial sums scattered (forward), gathered back (backward)
            add("reduce_scatter", "tp", 2 * micro, btd * micro * r * (1 + pos))
            add("all_gather", "tp", 2 * micro, btd * micro * r * (1 + pos))
        if shards.last:  # the head's input gathered (forward), its gradient scattered (backward)
            add("all_gather", "tp", micro, btd * micro * r)
            add("reduce_scatter", "tp", micro, btd * micro * r)
        # the norms' weight gradients are Partial DTensors: reduced once per step
        norms = 2 * sum(shards.blocks) + (1 if shards.last else 0)
        add("all_reduce", "tp", norms, norms * m.shape.dim * r)
    else:
        # backward: wq, wk and wv each reduce their input's gradient (no gather joins them), w1 once
        add("all_reduce", "tp", blocks * (2 * fwd + 4), btd * blocks * (2 * e * fwd + 4 * r))
        if shards.first:
            add("all_reduce", "tp", 2 * micro, btd * micro * r * (1 + pos))
        if shards.last:
            add("all_reduce", "tp", micro, btd * micro * r)
    if shards.last and not step.loss_parallel:  # the logits gathered over the vocabulary
        add("all_gather", "tp", micro, step.batch * m.seq_len * m.vocab * e * micro)
