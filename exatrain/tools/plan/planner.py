"""`exatrain plan`: check a layout for a world size in one process and estimate memory per GPU.

Per representative rank (rank 0 of each pipeline rank's group) the plan reports the MEASURED local shard
bytes of the parameters (from the DTensors of the real layout, built on the meta device under a fake
process group; see exatrain.tools.plan.layout), gradients and AdamW state derived from them, transient buffers
of FSDP/DDP, and an activation ESTIMATE per microbatch (formula in exatrain.tools.plan.memory), with a verdict
against a GPU memory size.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace

from exatrain.config import Config
from exatrain.distributed.parallel_dims import ParallelDims
from exatrain.errors import ConfigError
from exatrain.models import configured_shape
from exatrain.tools.plan import analytic, estimate, memory
from exatrain.tools.plan.comm import comm_table, measure_step_comm
from exatrain.tools.plan.layout import RankShards, measure_rank, representative_ranks
from exatrain.tools.plan.workload import analytic_model, compute_bytes, own_code, step_inputs, step_shape
from exatrain.train.preflight import preflight

MAX_WORLD_SIZE = 16384  # the largest layout the plan is tested on (tests/unit/test_plan.py)
KNOWN_VOCAB = {"synthetic": 512, "wikitext": 33278}  # WikiText-2's word vocabulary incl. <eos> / <unk>
ASSUMED_VOCAB = 32000


@dataclass(frozen=True)
class RankPlan:
    """Memory of one representative rank, in bytes."""

    rank: int
    pp_rank: int
    stages: tuple[int, ...]
    blocks: tuple[int, ...]
    params: int
    grads: int
    optimizer: int
    transient: int  # FSDP gathered units / DDP gradient buckets
    weight_copies: int  # bf16 copies of fp32 matmul weights that autocast keeps for backward
    activation_per_microbatch: int
    microbatches_in_flight: int
    activations: int
    total: int
    verdict: str


@dataclass(frozen=True)
class Plan:
    """The checked layout and its per-rank memory."""

    world_size: int
    layout: str
    degrees: dict
    vocab_size: int
    batch_per_microbatch: int
    seq_len: int
    gpu_memory_gb: float | None
    ranks: list[RankPlan]
    assumptions: list[str]
    elapsed_s: float
    comm: dict | None = None  # "kind over dim" -> {count, bytes, group_size} per rank per step (rank 0)
    time: dict | None = None  # the step-time prediction (estimate.StepTime) when hardware was given
    target: dict | None = None  # wall time and billing to --target-tokens (target.TargetCost)

    @property
    def peak(self) -> RankPlan:
        return max(self.ranks, key=lambda r: r.total)

    def to_dict(self) -> dict:
        out = {**asdict(self), "peak_total": self.peak.total, "verdict": self.peak.verdict}
        time = out.pop("time") or {}
        out = {**out, **time}  # step_time_s, tokens_per_s, tflops_per_gpu, mfu, breakdown, comm_s at the top
        if self.target:
            t = self.target
            out["wall_time_h"] = t["wall_time_h"]
            out["wall_time_range_h"] = t["wall_time_range_h"]
            keys = (
                "units",
                "units_range",
                "unit",
                "rule",
                "partition",
                "units_per_hour",
                "explanation",
                "jobs",
            )
            out["cost"] = {k: t[k] for k in keys}
        return out


def default_vocab(cfg: Config) -> tuple[int, bool]:
    """The vocabulary size the configured data would give, and whether it is only an assumption."""
    if cfg.data.kind in KNOWN_VOCAB:
        return KNOWN_VOCAB[cfg.data.kind], False
    if cfg.data.max_vocab:
        return cfg.data.max_vocab + 2, False  # + <eos> and <unk>
    return ASSUMED_VOCAB, True


def make_plan(
    cfg: Config,
    world_size: int,
    gpu_memory_gb: float | None = None,
    vocab_size: int | None = None,
    hardware=None,
    gpus_per_node: int = 0,
    comm: bool = False,
) -> Plan:
    """Validate the layout of `cfg` for `world_size` ranks (ConfigError with a HINT when it cannot work)
    and measure/estimate the memory of each representative rank; with `comm`, measure the collectives of
    one step; with `hardware` (a profiles.Hardware with the TIME_KEYS set)
    and `gpus_per_node`, predict the step time (exatrain.tools.plan.estimate, docs/planning.md)."""
    t0 = time.perf_counter()
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ConfigError(
            f"--world-size must be from 1 to {MAX_WORLD_SIZE}, got {world_size}",
            "pass the number of ranks (GPUs) of the job, e.g. --world-size 1024",
        )
    if vocab_size is not None and vocab_size < 2:
        raise ConfigError(
            f"--vocab-size must be at least 2, got {vocab_size}",
            "pass the tokenizer's vocabulary size, e.g. --vocab-size 32000",
        )
    dims = preflight(cfg, world_size)
    default, guessed = default_vocab(cfg)
    assumed = vocab_size is None and guessed
    vocab = vocab_size or default
    shards = [measure_rank(cfg, world_size, r, vocab) for r in representative_ranks(dims)]
    spec = activation_spec(cfg, dims, vocab)
    ranks = [rank_plan(s, cfg, dims, spec, gpu_memory_gb) for s in shards]
    notes = assumptions(cfg, dims, spec)
    if assumed:
        notes.insert(0, f"vocabulary of {vocab} assumed for data.kind={cfg.data.kind} (pass --vocab-size)")
    wanted = comm or hardware is not None
    collectives = _collectives(cfg, dims, world_size, vocab, notes, shards[0]) if wanted else None
    predicted = None
    if hardware is not None:
        predicted = _predict(cfg, dims, world_size, vocab, shards, collectives, hardware, gpus_per_node)
        notes.append(_time_note(gpus_per_node))
        notes.append(estimate.constants_note(hardware.source))
        sharded = sharding_note(dims, gpus_per_node)
        notes += [f"{sharded}; {within_node_alternative(dims, gpus_per_node)}"] if sharded else []
    return Plan(
        world_size=world_size,
        layout=dims.describe(),
        degrees=dims.degrees(),
        vocab_size=vocab,
        batch_per_microbatch=spec.batch,
        seq_len=spec.seq_len,
        gpu_memory_gb=gpu_memory_gb,
        ranks=ranks,
        assumptions=notes,
        elapsed_s=time.perf_counter() - t0,
        comm=None if collectives is None else comm_table(collectives),
        time=None if predicted is None else predicted.to_dict(),
    )


def _collectives(cfg: Config, dims: ParallelDims, world_size: int, vocab: int, notes: list[str], rank0):
    """Rank 0's collectives of one step, measured on fake tensors (pipeline layouts on a torch whose
    pipelining cannot take static stage shapes: counted in closed form from rank 0's measured shards,
    exatrain.tools.plan.analytic)."""
    measured = (
        "communication: every collective of one steady-state step of rank 0 (forward/backward, "
        "clipping, AdamW), measured on fake tensors under the fake process group; "
        "bytes = nccl-tests' S"
    )
    try:
        collectives = measure_step_comm(cfg, world_size, 0, vocab)
    except NotImplementedError as e:  # only pipeline layouts raise it (comm._static_stage_meta)
        notes.append(
            f"communication: the pipeline step cannot be measured with this torch ({e}); its collectives "
            "are counted in closed form (docs/planning.md)"
        )
        return analytic.collectives(analytic_model(cfg, vocab), dims, step_shape(cfg, dims), rank0)
    notes.append(measured)
    return collectives


def _predict(
    cfg: Config,
    dims: ParallelDims,
    world_size: int,
    vocab: int,
    shards,
    collectives,
    hardware,
    gpus_per_node: int,
) -> estimate.StepTime:
    inputs = step_inputs(
        cfg,
        dims,
        vocab,
        shape_params(cfg, vocab),
        gpus_per_node,
        max(s.param_elements for s in shards),
        own_code(gpus_per_node),
    )
    st = estimate.step_time(inputs, collectives, hardware)
    return replace(st, published_ratio=published_ratio(dims, gpus_per_node))


def sharding_note(dims: ParallelDims, gpus_per_node: int) -> str | None:
    """estimate.sharding_note for a layout whose FSDP group may span nodes; none without FSDP."""
    return estimate.sharding_note(analytic.shard_group(dims), gpus_per_node) if dims.fsdp else None


def within_node_alternative(dims: ParallelDims, gpus_per_node: int) -> str:
    """For a layout whose FSDP group spans nodes: the same ranks sharding within a node and replicating
    across nodes (HSDP), the kind of layout the validation table covers, as options to check it with."""
    shard = math.gcd(dims.dp_shard, max(1, gpus_per_node // dims.tp))
    replicate = dims.dp_replicate * dims.dp_shard // shard
    return (
        f"sharding within a node and replicating across nodes (--parallel.dp_shard={shard} "
        f"--parallel.dp_replicate={replicate}) stays within what the validation covers, if its memory fits "
        "(`exatrain plan --search` ranks both)"
    )


def published_ratio(dims: ParallelDims, gpus_per_node: int) -> dict:
    """estimate.published_ratio of this layout, as the step time carries it (a dict, for --json)."""
    group = analytic.shard_group(dims) if dims.fsdp else ()
    return asdict(estimate.published_ratio(group, gpus_per_node))


def shape_params(cfg: Config, vocab: int) -> int:
    """Parameters of the whole model (built on the meta device: no memory)."""
    import torch

    from exatrain.train.model_layout import lm_from_config

    with torch.device("meta"):
        return lm_from_config(cfg, vocab).num_params()


def _time_note(gpus_per_node: int) -> str:
    return (
        f"step time: PREDICTION from [hardware] constants (docs/planning.md): compute at matmul_tflops, "
        "the memory-bound kernels' bytes at hbm_gbs (not counted when the profile lacks it), "
        f"collectives at nccl-tests' busbw of the links they cross ({gpus_per_node} GPUs per node, ranks "
        "filling nodes in order), data-parallel traffic hidden behind compute and memory-bound "
        "kernels where it fits, tensor parallel exposed; not fitted to any measured step"
    )


def activation_spec(cfg: Config, dims: ParallelDims, vocab: int) -> memory.ActivationSpec:
    p = cfg.parallel
    micro = dims.microbatches(p) if dims.pp_enabled else 1
    return memory.ActivationSpec(
        shape=configured_shape(cfg.model),
        vocab=vocab,
        seq_len=cfg.data.seq_len,
        batch=cfg.train.micro_batch_size // micro,
        elem_bytes=compute_bytes(cfg),
        tp=dims.tp,
        sequence_parallel=p.sequence_parallel,
        loss_parallel=p.loss_parallel,
        ac=p.activation_checkpoint,
        ac_every=p.activation_checkpoint_every,
        dropout=cfg.model.dropout > 0,
        compiled=p.compile,
    )


def rank_plan(
    s: RankShards, cfg: Config, dims: ParallelDims, spec: memory.ActivationSpec, gpu_gb: float | None
) -> RankPlan:
    """Add gradients, optimizer state, transient buffers and activations to one rank's measured shards."""
    grads = s.param_bytes if s.grad_bytes is None else s.grad_bytes
    optim = memory.optimizer_bytes(s.param_elements, s.param_tensors)
    per_micro = max(
        memory.stage_activation_bytes(b, s.last and i == len(s.blocks) - 1, spec)
        for i, b in enumerate(s.blocks)
    )
    chunks = len(s.stages)
    in_flight = memory.microbatches_in_flight(
        cfg.parallel.pp_schedule, dims.pp, s.pp_rank, dims.microbatches(cfg.parallel), chunks
    )
    acts = per_micro * in_flight + memory.head_backward_bytes(s.last, spec)
    transient = transient_bytes(s, cfg, dims, grads)
    autocast_copies = spec.elem_bytes == 2 and cfg.parallel.param_dtype == "fp32"
    copies = int(memory.weight_copy_bytes(sum(s.blocks), s.last, spec)) if autocast_copies else 0
    offload = cfg.parallel.cpu_offload  # parameters, gradients and optimizer state in host memory
    state = 0 if offload else s.param_bytes + optim
    device_grads = 0 if offload else grads
    # backward frees a block's activations as it creates the block's gradients: they add up only when
    # gradients are already held while activations are kept (accumulation over micro-batches, pipelines)
    working = acts + device_grads if _grads_held_during_forward(cfg, dims) else max(acts, device_grads)
    total = state + transient + copies + working
    return RankPlan(
        rank=s.rank,
        pp_rank=s.pp_rank,
        stages=s.stages,
        blocks=s.blocks,
        params=s.param_bytes,
        grads=grads,
        optimizer=optim,
        transient=transient,
        weight_copies=copies,
        activation_per_microbatch=int(per_micro),
        microbatches_in_flight=in_flight,
        activations=int(acts),
        total=int(total),
        verdict=memory.verdict(total, gpu_gb),
    )


def _grads_held_during_forward(cfg: Config, dims: ParallelDims) -> bool:
    """Does a forward run while gradients exist? With pipeline parallel or gradient accumulation, yes."""
    t = cfg.train
    return dims.pp_enabled or t.global_batch_size > t.micro_batch_size * dims.dp


def transient_bytes(s: RankShards, cfg: Config, dims: ParallelDims, grads: int) -> int:
    """Buffers that live next to the shards during a step.

    FSDP: a unit's all-gathered parameters (param_dtype) for the running unit and the prefetched next one,
    plus its unsharded gradient and the fp32 reduce-scatter input; without resharding after forward every
    unit stays gathered until backward. DDP: its gradient buckets, a second copy of the gradients.
    """
    if dims.fsdp:
        ratio = (2 if cfg.parallel.param_dtype == "bf16" else 4) / 4  # units were measured in fp32 storage
        largest, everything = s.largest_unit_bytes * ratio, s.all_units_bytes * ratio
        gathered = 2 * largest if cfg.parallel.fsdp_reshard_after_forward else everything
        return int(
            gathered + largest + s.largest_unit_bytes
        )  # + unsharded grad (param_dtype) + fp32 reduce input
    return grads if dims.ddp else 0


def _block_note(spec: memory.ActivationSpec) -> str:
    if spec.elem_bytes == 4:
        return f"{memory.FULL_BLOCK} x B*T*D fp32 elements per block"
    residual, casts, sharded = memory.BF16_BLOCK["compiled" if spec.compiled else "eager"]
    return (
        f"{residual + casts + sharded} bytes x B*T*D per block under bf16 autocast "
        f"({'compiled' if spec.compiled else 'eager'}; fp32 residual stream; measured on an H100), "
        "bf16 copies of the fp32 matmul weights in their own row"
    )


def assumptions(cfg: Config, dims: ParallelDims, spec: memory.ActivationSpec) -> list[str]:
    """What the numbers assume, printed under the table."""
    notes = [
        "parameters: measured local shards (fp32 storage) of the layout built on the meta "
        "device, fake process group",
        "gradients: measured by a backward on the meta device; under FSDP (which cannot run there) the "
        "parameters' shards and dtype, where its reduce-scatter puts them (its bf16 copies are transient)",
        "optimizer: AdamW, 2 x fp32 per parameter element + one fp32 step per tensor",
        "FSDP/DDP buffers: ESTIMATE, FSDP: largest unit gathered twice (running + prefetched) in "
        "param_dtype, "
        "its unsharded gradient and fp32 reduce input; DDP: its buckets, one more copy of the gradients",
        f"activations: ESTIMATE, {_block_note(spec)} (flash attention), "
        f"B = {spec.batch} samples per microbatch, T = {spec.seq_len}; checkpointing: "
        f"{cfg.parallel.activation_checkpoint}; "
        "the last stage adds 8 bytes per logit for the loss's backward",
        "gradients and activations: their sum when gradients exist during a forward "
        "(accumulation, pipeline), "
        "else the larger (backward frees activations as it creates gradients)",
        "not included: CUDA context (~0.5-1 GiB), allocator fragmentation, NCCL buffers; "
        f"'tight' above {memory.TIGHT_FRACTION:.0%} of the GPU",
    ]
    if cfg.parallel.cpu_offload:
        notes.append(
            "cpu_offload: parameters, gradients and optimizer state live in host memory "
            "(not in the GPU total)"
        )
    if dims.pp_enabled:
        notes.append(
            f"pipeline: {cfg.parallel.pp_schedule}, {dims.microbatches(cfg.parallel)} microbatches; "
            "activations x microbatches in flight on each pipeline rank"
        )
    return notes
