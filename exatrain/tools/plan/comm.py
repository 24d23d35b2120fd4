"""Communication of one training step, per rank: every collective, by kind and mesh dimension, MEASURED.

Like the memory (exatrain.tools.plan.layout), the plan does not start the ranks: it joins torch's fake
process group as one representative rank, builds that rank's part of the layout exactly as training does,
materialises it as *fake tensors* (torch's FakeTensorMode: shapes and dtypes, no storage, no compute), and
runs the trainer's step on it: the engine's forward/backward over the rank's micro-batches (gradient
accumulation included), then the gradient-norm clipping. A TorchDispatchMode records each collective op the
step dispatches (the c10d ops FSDP2, DDP's reducer and the pipeline schedule call, and DTensor's functional
collectives), with the bytes of its buffers and the ranks of its group. Steps are run until DDP has rebuilt
its buckets (one step first without DDP: FSDP's lazy init, AdamW's state); the last one is reported (the
steady state).

Pipeline layouts: the stages get their shapes statically (see `_static_stage_meta`) instead of by the
schedule's first-step exchange, which reads back received values that fake tensors do not have.

Bytes are the buffer size nccl-tests calls S (so that time = S x factor / busbw, see estimate.py):
all-gather: the gathered output; reduce-scatter: the input; all-reduce, broadcast, send, recv: the tensor;
all-to-all: the input. The optimizer step counts: under sequence parallel the norms' gradients are Partial
DTensors, and each AdamW operation that reads one all-reduces it again (measured on real ranks too).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from exatrain.config import Config
from exatrain.distributed.parallel_dims import DIM_ORDER, ParallelDims
from exatrain.tools.plan.layout import build_rank_stages, fake_group
from exatrain.train.model_layout import apply_layout as apply_training_layout

WARMUP_STEPS = 2  # DDP rebuilds its buckets in the second step (in the order gradients became ready)

# c10d op -> (kind, index of the argument whose tensors make nccl-tests' size S)
C10D_OPS = {
    "allreduce_": ("all_reduce", 0),
    "allreduce_coalesced_": ("all_reduce", 0),
    "_allgather_base_": ("all_gather", 0),
    "allgather_": ("all_gather", 0),
    "allgather_coalesced_": ("all_gather", 0),
    "allgather_into_tensor_coalesced_": ("all_gather", 0),
    "_reduce_scatter_base_": ("reduce_scatter", 1),
    "reduce_scatter_": ("reduce_scatter", 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
    "broadcast_": ("broadcast", 0),
    "send": ("send", 0),
    "recv_": ("recv", 0),
    "recv_any_source_": ("recv", 0),
    "alltoall_": ("all_to_all", 1),
    "alltoall_base_": ("all_to_all", 1),
    "reduce_": ("reduce", 0),
    "gather_": ("gather", 1),
    "scatter_": ("scatter", 0),
    "barrier": ("barrier", None),
}
FUNCTIONAL_OPS = {  # _c10d_functional op -> kind (S from the first argument; all-gather: x group size)
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_reduce_coalesced_": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_out": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast",
    "broadcast_": "broadcast",
}


@dataclass(frozen=True)
class Collective:
    """One kind of collective over one mesh dimension in one step of one rank."""

    kind: str  # all_gather, reduce_scatter, all_reduce, broadcast, send, recv, all_to_all, ...
    dim: str  # the mesh dimension(s) its group spans, e.g. "dp_shard" or "dp_replicate+dp_shard"
    group_size: int
    count: int
    bytes: int  # nccl-tests' S summed over the calls
    ranks: tuple[int, ...] = field(default=(), compare=False)  # the group's global ranks (of one call)


def tensor_bytes(x) -> int:
    """Bytes of a tensor or of the tensors in (nested) lists."""
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(tensor_bytes(t) for t in x)
    return 0


class CollectiveRecorder(TorchDispatchMode):
    """Records (kind, group ranks, bytes) of every collective op dispatched while active."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, tuple[int, ...], int]] = []
        self.enabled = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(issubclass(t, DTensor) for t in types):
            # let DTensor run the op with this mode still active, so that the collectives it issues to
            # redistribute (TP, clipping) reach it too (as torch's CommDebugMode does)
            return NotImplemented
        if self.enabled:
            call = describe_call(func, args)
            if call is not None:
                self.calls.append(call)
        return func(*args, **kwargs)


def describe_call(func, args) -> tuple[str, tuple[int, ...], int] | None:
    """(kind, ranks of the group, nccl-tests size S in bytes) of a collective op, None for other ops."""
    namespace, name = func.namespace, func._opname
    if namespace == "c10d" and name in C10D_OPS:
        kind, arg = C10D_OPS[name]
        group = dist.ProcessGroup.unbox(next(a for a in args if _is_group(a)))
        return kind, tuple(dist.get_process_group_ranks(group)), 0 if arg is None else tensor_bytes(args[arg])
    if namespace == "_c10d_functional" and name in FUNCTIONAL_OPS:
        from torch.distributed.distributed_c10d import _resolve_process_group

        group = _resolve_process_group([a for a in args if isinstance(a, str)][-1])  # group_name comes last
        ranks = tuple(dist.get_process_group_ranks(group))
        size = tensor_bytes(args[0])
        kind = FUNCTIONAL_OPS[name]
        return kind, ranks, size * len(ranks) if kind == "all_gather" else size
    return None


def _is_group(arg) -> bool:
    """Is `arg` a process group as c10d ops receive it (a TorchScript object of class c10d.ProcessGroup)?"""
    return isinstance(arg, torch.ScriptObject) and arg._type().qualified_name().endswith("c10d.ProcessGroup")


def dim_label(ranks: tuple[int, ...], dims: ParallelDims) -> str:
    """The mesh dimensions along which a group's ranks differ (mesh order pp, dp_replicate, dp_shard, tp),
    from their coordinates in the layout's rank grid; "world" is every dimension of degree > 1."""
    names = [n for n in DIM_ORDER if getattr(dims, n) > 1]
    sizes = [getattr(dims, n) for n in names]

    def coords(rank: int) -> tuple[int, ...]:
        out = []
        for s in reversed(sizes):  # row-major: the last (innermost) dimension varies fastest
            out.append(rank % s)
            rank //= s
        return tuple(reversed(out))

    grid = [coords(r) for r in ranks]
    varying = [n for i, n in enumerate(names) if len({c[i] for c in grid}) > 1]
    return "+".join(varying) or "self"


def summarize(calls, dims: ParallelDims) -> list[Collective]:
    """Group recorded calls by (kind, mesh dimension): count and bytes, sorted by bytes (largest first)."""
    table: dict[tuple[str, str, int], list] = defaultdict(lambda: [0, 0, ()])
    for kind, ranks, nbytes in calls:
        entry = table[(kind, dim_label(ranks, dims), len(ranks))]
        entry[0] += 1
        entry[1] += nbytes
        entry[2] = ranks
    return sorted(
        (Collective(k, d, g, c, b, r) for (k, d, g), (c, b, r) in table.items()),
        key=lambda c: (-c.bytes, c.kind, c.dim),
    )


def measure_step_comm(cfg: Config, world_size: int, rank: int, vocab_size: int) -> list[Collective]:
    """The collectives `rank` issues in one steady-state training step of the layout of `cfg`."""
    with fake_group(rank, world_size):
        dims = ParallelDims.from_config(cfg.parallel, world_size)
        dims.build_mesh("cpu")
        for name in ("pp", "dp_replicate", "dp_shard", "tp", "dp", "fsdp"):
            dims.mesh(name)  # sliced now: slicing computes coordinates, which fake tensors cannot
        recorder = CollectiveRecorder()
        from torch._subclasses.fake_tensor import FakeTensorMode

        pp_rank = dims.coordinate("pp")
        stages = _layout_stages(cfg, dims, vocab_size, pp_rank)  # on the meta device, outside the fake mode
        first = _layout_stages(cfg, dims, vocab_size, 0) if dims.pp_enabled and pp_rank else None
        with FakeTensorMode(allow_non_fake_inputs=True):
            step = _fake_step(cfg, dims, stages, recorder, first)
            with recorder:
                for _ in range(WARMUP_STEPS if _uses_ddp(dims) else 1):  # the others: steady after one
                    step()
                recorder.calls.clear()
                step()
        return summarize(recorder.calls, dims)


def _fake_step(cfg: Config, dims: ParallelDims, stages, recorder: CollectiveRecorder, first=None):
    """A function running one training step of this rank (engine forward/backward + clipping) on fake
    tensors: the layout applied as training applies it, the engine training uses."""
    from exatrain.distributed.grad_norm import clip_grad_norm_
    from exatrain.engines.optim import build_optimizer

    engine, parts = _build_engine(cfg, dims, stages, first)
    optimizer = build_optimizer(parts, cfg.train)
    t = cfg.train
    micro = t.global_batch_size // (t.micro_batch_size * dims.dp)
    tokens = (t.micro_batch_size, cfg.data.seq_len)
    batches = [(torch.zeros(tokens, dtype=torch.long),) * 2 for _ in range(micro)]
    ddp = DdpBuckets(parts[0], dims, recorder) if _uses_ddp(dims) else None

    def step():
        engine.train_step(batches)
        if ddp is not None:
            ddp.step_done()
        if t.grad_clip > 0:
            clip_grad_norm_(parts, t.grad_clip, pp_mesh=dims.mesh("pp"))
        optimizer.step()  # AdamW communicates too where gradients are Partial DTensors (norms under SP)
        optimizer.zero_grad(set_to_none=True)

    return step


class DdpBuckets:
    """The all-reduces torch's DDP issues, computed with DDP's own bucketing (torch's DDP cannot wrap fake
    tensors: its constructor reads parameter data).

    As DDP's reducer does (torch/nn/parallel/distributed.py, reducer.cpp): the first step reduces all
    gradients in one bucket; then the buckets are rebuilt once, in the order the gradients became ready in
    that step's synchronising backward, with torch's `_compute_bucket_assignment_by_size` and the default
    limits (1 MiB first bucket, then bucket_cap_mb = 25 MiB); every later step all-reduces each bucket once
    (gradient accumulation runs the earlier micro-batches under no_sync)."""

    def __init__(self, model: torch.nn.Module, dims: ParallelDims, recorder: CollectiveRecorder):
        self.params = [q for q in model.parameters() if q.requires_grad]
        self.ranks = tuple(dist.get_process_group_ranks(dims.mesh("dp").get_group()))
        self.recorder, self.ready, self.buckets = recorder, [], None
        for i, q in enumerate(self.params):
            q.register_post_accumulate_grad_hook(lambda _, i=i: self.ready.append(i))

    def step_done(self) -> None:
        if self.buckets is None:
            order = list(dict.fromkeys(self.ready[-len(self.params) :]))  # the synchronising backward's order
            everything = [list(range(len(self.params)))]
            self.buckets = self._assign(order) if len(order) == len(self.params) else everything
            sizes = [sum(_nbytes(self.params[i]) for i in range(len(self.params)))]
        else:
            sizes = [sum(_nbytes(self.params[i]) for i in b) for b in self.buckets]
        self.recorder.calls.extend(("all_reduce", self.ranks, n) for n in sizes)
        self.ready.clear()

    def _assign(self, order: list[int]) -> list[list[int]]:
        cap = 25 * 1024 * 1024  # DDP's bucket_cap_mb default (_DEFAULT_BUCKET_CAP_MB)
        meta = [torch.empty(self.params[i].shape, dtype=self.params[i].dtype, device="meta") for i in order]
        buckets, _ = dist._compute_bucket_assignment_by_size(
            meta, [dist._DEFAULT_FIRST_BUCKET_BYTES, cap], [False] * len(order), list(range(len(order)))
        )
        return [[order[j] for j in b] for b in buckets]


def _nbytes(q: torch.Tensor) -> int:
    return q.numel() * q.element_size()


def _autocast(cfg: Config):
    """bf16 autocast unless the run asks for fp32 (auto = bf16 on the GPUs a plan is for, as the memory
    plan assumes); on the CPU autocast, which casts the same matrix products to bf16."""
    bf16 = cfg.train.precision != "fp32"
    return lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)


def _layout_stages(cfg: Config, dims: ParallelDims, vocab_size: int, pp_rank: int):
    """[(stage index, chunk)] of this rank on the meta device, with the layout applied as training applies
    it (without torch.compile, which changes no collective), except replication without pipeline parallel:
    DDP (see DdpBuckets) and the TP replicas' gradient sync, whose hooks go on the materialised parameters."""
    with torch.device("meta"):
        stages = build_rank_stages(cfg, dims, vocab_size, pp_rank)
    for _, chunk in stages:
        apply_training_layout(
            chunk,
            SimpleNamespace(dims=dims, device=torch.device("cpu")),
            dc_replace(cfg.parallel, compile=False),
            layout="none" if _replicates(dims) else "auto",
        )
    return stages


def _build_engine(cfg: Config, dims: ParallelDims, stages, first=None):
    """(engine, model parts) of this rank, as train/build.py builds them, materialised as fake tensors."""
    from exatrain.train.data_parallel_engine import DataParallelEngine

    loss_parallel = dims.tp_enabled and cfg.parallel.loss_parallel
    for _, chunk in stages:
        _materialise(chunk)
    if not dims.pp_enabled:
        model = stages[0][1]
        if _replicates(dims) and dims.tp_enabled:
            from exatrain.distributed.replica_sync import sync_replica_gradients

            sync_replica_gradients(model, dims.mesh("dp"))  # as exatrain.distributed.wrap._replicate does
        return DataParallelEngine(model, torch.device("cpu"), 0, loss_parallel, _autocast(cfg)), [model]
    return _pipeline_engine(cfg, dims, stages, loss_parallel, first)


def _materialise(chunk: torch.nn.Module) -> None:
    """Fake-tensor storage for a meta-device chunk (inside FakeTensorMode). A sharded chunk goes through
    to_empty, which FSDP2 hooks to re-point its shards; a plain one gets new Parameters (to_empty's tensor
    swap refuses plain meta parameters there)."""
    if any(isinstance(q, DTensor) for q in chunk.parameters()):
        chunk.to_empty(device="cpu")
        return
    for module in chunk.modules():
        for name, q in list(module._parameters.items()):
            if q is not None:
                fake = torch.empty_like(q, device="cpu")
                module._parameters[name] = torch.nn.Parameter(fake, q.requires_grad)


def _replicates(dims: ParallelDims) -> bool:
    """Pure replication without pipeline parallel: DDP, or the TP replicas' gradient sync."""
    return dims.ddp and not dims.pp_enabled


def _uses_ddp(dims: ParallelDims) -> bool:
    """torch's DDP wraps pure replication without TP and PP (exatrain.distributed.wrap._replicate)."""
    return dims.ddp and not dims.tp_enabled and not dims.pp_enabled


def _pipeline_engine(cfg: Config, dims: ParallelDims, stages, loss_parallel: bool, first=None):
    import exatrain
    from exatrain.models.transformer import lm_loss
    from exatrain.train.pipeline_engine import PipelineEngine

    p = cfg.parallel
    chunks = [c for _, c in stages]
    ids = [s for s, _ in stages]
    pipeline = exatrain.Pipeline(
        chunks,
        ids,
        dims.pp * p.pp_stages_per_rank,
        dims.mesh("pp").get_group(),
        torch.device("cpu"),
        p.pp_schedule,
        dims.microbatches(p),
        lm_loss,
    )
    _static_stage_meta(pipeline, cfg, dims, stages, first, _autocast(cfg))
    holder = torch.nn.ModuleList(chunks)
    return PipelineEngine(holder, pipeline, 0, loss_parallel, _autocast(cfg)), chunks


def _static_stage_meta(pipeline, cfg: Config, dims: ParallelDims, stages, first, autocast) -> None:
    """Give this rank's pipeline stages the shapes of what they receive and send, and skip the schedule's
    warm-up vote (torch 2.13's pipelining: the stages vote for STATIC or DYNAMIC metadata and, DYNAMIC,
    exchange their shapes as pickled objects in the first step; a fake tensor has no value to read back).

    Real ranks infer the same shapes in their first step (DYNAMIC); after it, both run the same steady
    state, the only step the plan reports. Shapes: a micro-batch's pipeline microbatch of tokens into
    stage 0; every later stage receives stage 0's output (the LM's hidden states between blocks), which is
    computed here by running stage 0 (this rank's, or `first`, pipeline rank 0's stage 0) on fake tokens;
    each stage's output is its own forward's on that input."""
    from torch.distributed.pipelining import _utils as pipe_utils

    if not hasattr(pipe_utils, "_StageMeta") or not hasattr(pipeline.schedule, "_warmup_p2p"):
        raise NotImplementedError("torch.distributed.pipelining without static stage metadata (torch < 2.13)")
    t = cfg.train
    tokens = torch.zeros(
        (t.micro_batch_size // dims.microbatches(cfg.parallel), cfg.data.seq_len), dtype=torch.long
    )
    with torch.no_grad(), autocast(), _loss_parallel(cfg, dims):
        chunk0 = stages[0][1] if stages[0][0] == 0 else _materialised(first)
        hidden = chunk0(tokens)
        for stage, (index, chunk) in zip(pipeline.stages, stages):
            x = tokens if index == 0 else torch.empty_like(hidden)
            y = chunk(x)
            stage._user_meta = pipe_utils._StageMeta(inputs=(_meta(x),), outputs=(_meta(y),))

    def static(stages, has_backward, p2p_done):
        for stage in stages:
            stage._inference_mode = pipe_utils.InferenceMode.STATIC

    pipeline.schedule._warmup_p2p = static


def _meta(x: torch.Tensor):
    """A stage tensor's metadata as the training forward has it (computed here under no_grad): floating
    point tensors require gradients (activations and their inputs are part of the backward)."""
    from torch.distributed.pipelining import _utils as pipe_utils

    return dc_replace(pipe_utils.extract_tensor_meta(x), requires_grad=x.is_floating_point())


def _materialised(stages):
    """Stage 0's chunk of pipeline rank 0's `stages`, materialised (all of them: FSDP's lazy init checks
    every chunk of the model it was applied to)."""
    for _, chunk in stages:
        _materialise(chunk)
    return stages[0][1]


def _loss_parallel(cfg: Config, dims: ParallelDims):
    """torch's loss_parallel context where the layout computes the loss on vocabulary shards (as the
    engine's context does), else a no-op."""
    import contextlib

    if dims.tp_enabled and cfg.parallel.loss_parallel:
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()
    return contextlib.nullcontext()


def comm_table(collectives: list[Collective]) -> dict[str, dict]:
    """{"kind over dim": {kind, dim, count, bytes, group_size}} for JSON."""
    return {
        f"{c.kind} over {c.dim}": {
            "kind": c.kind,
            "dim": c.dim,
            "count": c.count,
            "bytes": c.bytes,
            "group_size": c.group_size,
        }
        for c in collectives
    }
