"""Build one rank's share of a layout in this process, on the meta device, and measure its shards.

`exatrain plan` must check layouts of up to 16,384 ranks on a laptop, so it cannot start the ranks.
Instead it joins torch's *fake* process group (torch.testing._internal.distributed.fake_pg: every
collective is a no-op, but DeviceMesh, DTensor, tensor parallelism and FSDP2 compute the same local shard
shapes as in a real job) as one representative rank at a time, builds the model on the meta device (no
memory), applies the real layout code and reads the local shard shapes of the DTensors. The fake group is
used only here, for what cannot run on this machine; the tests check the numbers against real gloo ranks.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from types import SimpleNamespace

import torch
import torch.distributed as dist

from exatrain.config import Config
from exatrain.distributed.parallel_dims import ParallelDims
from exatrain.distributed.parallelize import local_tensor
from exatrain.distributed.pipeline import stage_ids
from exatrain.errors import ExatrainError
from exatrain.models.pipeline_split import split_for_stages
from exatrain.train.model_layout import apply_layout as apply_training_layout
from exatrain.train.model_layout import lm_from_config


@dataclass(frozen=True)
class RankShards:
    """What one rank holds of the model, measured on its meta-device shards."""

    rank: int
    pp_rank: int
    stages: tuple[int, ...]  # pipeline stage indices this rank runs (one, or several when interleaved)
    blocks: tuple[int, ...]  # blocks per owned stage
    first: bool  # holds the embeddings
    last: bool  # holds the final norm and the output head
    param_elements: int  # local parameter elements (fp32 storage)
    param_tensors: int
    param_bytes: int
    grad_bytes: int | None  # measured by a backward on the meta device; None where that cannot run (FSDP)
    largest_unit_bytes: int  # parameters of the largest FSDP unit, gathered over the shard dimension
    all_units_bytes: int  # all FSDP units gathered (held after forward when not resharding)


@contextlib.contextmanager
def fake_group(rank: int, world_size: int):
    """Join a fake process group as `rank` of `world_size` for the duration of the block."""
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend
    except ImportError as e:
        raise ExatrainError(
            f"this torch build lacks the fake process group exatrain plan needs ({e})",
            f"use a PyTorch wheel that ships torch.testing._internal (here: {torch.__version__})",
        ) from None
    if dist.is_initialized():
        raise ExatrainError(
            "exatrain plan needs a process without a process group, but one is already initialized",
            "run `exatrain plan` on its own, not inside a training job",
        )
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        _forget_meshes()


def _forget_meshes() -> None:
    """Drop DTensor's caches of sharding and redistribution plans. They are keyed by meshes, and the next
    representative rank's mesh compares equal to this one's (same shape and names) while its process groups
    are new: a cached plan would name a group of the destroyed fake group."""
    try:  # private torch API (2.13); older versions without these caches have nothing to clear
        from torch.distributed.tensor import _redistribute
        from torch.distributed.tensor.debug import (
            _clear_fast_path_sharding_prop_cache,
            _clear_sharding_prop_cache,
        )
    except ImportError:
        return
    _clear_sharding_prop_cache()  # Python cache
    _clear_fast_path_sharding_prop_cache()  # C++ dispatch fast path cache
    _redistribute._gen_transform_infos.cache_clear()
    _redistribute.clear_redistribute_planner_cache()


def representative_ranks(dims: ParallelDims) -> list[int]:
    """Rank 0 of each pipeline rank's group: the ranks whose shards differ (data-parallel and TP peers hold
    equal shards; rank 0 of a dimension holds the larger one when a size does not divide evenly)."""
    return [p * (dims.world_size // dims.pp) for p in range(dims.pp)]


def measure_rank(cfg: Config, world_size: int, rank: int, vocab_size: int) -> RankShards:
    """Build `rank`'s part of the layout on the meta device under a fake group and measure it."""
    with fake_group(rank, world_size):
        dims = ParallelDims.from_config(cfg.parallel, world_size)
        dims.build_mesh("cpu")
        pp_rank = dims.coordinate("pp")
        with torch.device("meta"):
            stages = build_rank_stages(cfg, dims, vocab_size, pp_rank)
        for _, module in stages:
            apply_layout(module, dims, cfg)
        return _measure(rank, pp_rank, stages, dims, meta_grad_bytes(stages, dims, cfg))


def meta_grad_bytes(stages, dims: ParallelDims, cfg: Config) -> int | None:
    """Gradient bytes after one forward/backward of each chunk on the meta device (free), or None.

    Worth running because gradients need not be sharded like their parameters: with tensor parallel and
    no FSDP, torch returns the gradients of the row-sharded embeddings whole (Replicate). FSDP (and FSDP2's
    replicate) refuse to run on meta parameters, but there the gradients are reduce-scattered into exactly
    the parameters' shards, so None (= the parameters' bytes) is right for them.
    """
    if dims.fsdp or (dims.pp_enabled and dims.ddp):
        return None
    p = cfg.parallel
    shape = stages[0][1].shape
    t = min(cfg.data.seq_len, 16)  # gradient shapes do not depend on the batch; keep the graph small
    with contextlib.ExitStack() as stack:
        if dims.tp_enabled and p.loss_parallel:
            from torch.distributed.tensor.parallel import loss_parallel

            stack.enter_context(loss_parallel())
        for _, chunk in stages:
            tokens = torch.zeros(1, t, dtype=torch.long, device="meta")
            # a later pipeline stage gets hidden states (its sequence shard under sequence parallel)
            x = (
                tokens
                if chunk.tok_embeddings is not None
                else torch.zeros(1, t // (dims.tp if p.sequence_parallel else 1), shape.dim, device="meta")
            )
            out = chunk(x, tokens) if chunk.output is not None else chunk(x)
            (out if out.dim() == 0 else out.float().sum()).backward()
    return sum(
        local_tensor(q.grad).numel() * q.grad.element_size()
        for _, m in stages
        for q in m.parameters()
        if q.grad is not None
    )


def _measure(rank: int, pp_rank: int, stages, dims: ParallelDims, grad_bytes: int | None) -> RankShards:
    params = [p for _, m in stages for p in m.parameters()]
    elements = sum(local_tensor(p).numel() for p in params)
    units = [u for _, m in stages for u in fsdp_units(m, dims)] or [0]
    n_stages = dims.pp * len(stages)  # every pipeline rank runs the same number of chunks
    return RankShards(
        rank=rank,
        pp_rank=pp_rank,
        stages=tuple(s for s, _ in stages),
        blocks=tuple(len(m.layers) for _, m in stages),
        first=any(s == 0 for s, _ in stages),
        last=any(s == n_stages - 1 for s, _ in stages),
        param_elements=elements,
        param_tensors=len(params),
        param_bytes=sum(local_tensor(p).numel() * p.element_size() for p in params),
        grad_bytes=grad_bytes,
        largest_unit_bytes=max(units),
        all_units_bytes=sum(units),
    )


def local_state_bytes(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, int]:
    """Bytes of this rank's local parameter, gradient and optimizer-state shards (works on real ranks and on
    meta tensors alike): what `exatrain plan` predicts and what the tests and benchmarks measure."""

    def nbytes(t):
        t = local_tensor(t)
        return t.numel() * t.element_size()

    out = {
        "params": sum(nbytes(p) for p in model.parameters()),
        "grads": sum(nbytes(p.grad) for p in model.parameters() if p.grad is not None),
        "optimizer": 0,
    }
    if optimizer is not None:
        out["optimizer"] = sum(
            nbytes(v) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)
        )
    return out


def fsdp_units(model: torch.nn.Module, dims: ParallelDims) -> list[int]:
    """Bytes of each FSDP unit's parameters once all-gathered over the shard dimension (what a unit holds
    unsharded during its forward/backward), for the modules fully_shard wrapped."""
    from torch.distributed.fsdp import FSDPModule

    if not dims.fsdp:
        return []
    owned: dict[int, int] = {}  # parameter id -> id of the innermost FSDP module managing it
    for module in model.modules():  # parents come before children, so children overwrite
        if isinstance(module, FSDPModule):
            for p in module.parameters():
                owned[id(p)] = id(module)
    sizes: dict[int, int] = {}
    for p in model.parameters():
        unit = owned.get(id(p))
        if unit is not None:
            sizes[unit] = sizes.get(unit, 0) + local_tensor(p).numel() * p.element_size() * dims.dp_shard
    return list(sizes.values())


# -- the layout itself, built and applied by the functions training uses (train/model_layout.py) --


def build_rank_stages(cfg: Config, dims: ParallelDims, vocab_size: int, pp_rank: int):
    """[(stage index, chunk)] of the model chunks `pp_rank` runs (the whole model without PP), split as
    the pipeline engine splits them (models.pipeline_split, looped stage assignment)."""
    model = lm_from_config(cfg, vocab_size)
    if not dims.pp_enabled:
        return [(0, model)]
    spr = cfg.parallel.pp_stages_per_rank
    ids = stage_ids(pp_rank, dims.pp, spr)
    return list(zip(ids, split_for_stages(model, ids, dims.pp * spr)[1]))


def apply_layout(chunk, dims: ParallelDims, cfg: Config) -> None:
    """The layout exactly as training applies it, without torch.compile, which changes no shard and would
    only cost time on the meta device; "cpu" never pins memory (which needs a GPU). Replication without
    pipeline parallel (DDP, TP replicas' gradient sync) is left out: it changes no shard, and DDP cannot
    wrap a meta-device model."""
    # exatrain.parallelize needs only a Context's dims and device: the plan's fake-group layout gives both
    layout = "none" if dims.ddp and not dims.pp_enabled else "auto"
    apply_training_layout(
        chunk,
        SimpleNamespace(dims=dims, device=torch.device("cpu")),
        replace(cfg.parallel, compile=False),
        layout=layout,
    )
