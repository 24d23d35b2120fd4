"""`exatrain.parallelize(model, ctx)`: a parallel layout for any nn.Module, no model knowledge needed.

Applies exatrain.distributed.parallelize's steps in the reference model's order: tensor parallel (when
the caller gives a plan) -> activation checkpointing per block -> torch.compile per block -> FSDP2 per
block then the root, or DDP around the whole model. The blocks are found automatically
(exatrain.distributed.blocks) or passed in.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from exatrain.distributed.blocks import find_blocks
from exatrain.distributed.parallelize import apply_ac, apply_compile, apply_ddp, apply_fsdp, apply_tp
from exatrain.distributed.pipeline import apply_replicate
from exatrain.distributed.replica_sync import sync_replica_gradients
from exatrain.errors import ConfigError

LAYOUTS = ("auto", "ddp", "fsdp", "hsdp", "none")


def parallelize(
    model: nn.Module,
    ctx,
    layout: str = "auto",
    blocks=None,
    activation_checkpoint=False,
    compile=False,
    param_dtype: torch.dtype | None = None,
    cpu_offload: bool = False,
    tp_plan: dict | None = None,
    *,
    compile_backend: str = "inductor",
    reshard_after_forward: bool = True,
) -> nn.Module:
    """Return `model` on `ctx.device`, parallelised for `layout` over the ranks of `ctx` (collective).

    layout "auto": HSDP when ctx has dp_shard > 1 and dp_replicate > 1, FSDP when dp_shard > 1, DDP when
    more than one data-parallel rank, else none. "fsdp"/"ddp" over all data-parallel ranks of ctx; with a
    single data-parallel rank they add nothing (AC, compile and TP still apply; param_dtype and cpu_offload
    are then ignored). Every rank must start from the same weights (exatrain.init seeds every rank alike;
    rank 0's weights are broadcast to be sure).

    Replication ("ddp") where torch's DDP cannot wrap the model: a tensor-parallel model (DTensors) averages
    its gradients over the data-parallel ranks at the end of each backward (replica_sync; the model gets
    `set_requires_gradient_sync`), and a pipeline stage (ctx with pp > 1) gets FSDP2's `replicate`. A model
    on the meta device (pipeline stages built without memory) is parallelised in place and stays there:
    fill it with `exatrain.load_full_state_dict` afterwards.
    """
    layout = _resolve_layout(layout, ctx)
    if tp_plan is not None and ctx.dims.tp < 2:
        raise ConfigError(
            "parallelize(tp_plan=...) needs tensor-parallel ranks, but ctx has tp=1",
            "start with exatrain.init(tp=2) (or more), or drop tp_plan",
        )
    if layout not in ("fsdp", "hsdp") and (param_dtype is not None or cpu_offload):
        raise ConfigError(
            f"parallelize(param_dtype=..., cpu_offload=...) are FSDP options, but the layout is {layout!r}",
            "use layout='fsdp' (with exatrain.init(dp_shard=N) or on more than one rank), or "
            "torch.autocast for bf16 compute without FSDP",
        )
    if layout in ("fsdp", "ddp") and ctx.dims.dp == 1:
        layout = "none"  # a single data-parallel rank: nothing to shard or replicate over
    cpu_offload = cpu_offload and layout in ("fsdp", "hsdp")
    ac_mode, ac_every = _ac_mode(activation_checkpoint)
    needs_blocks = layout in ("fsdp", "hsdp") or ac_mode != "none" or bool(compile)
    found = find_blocks(model, blocks) if needs_blocks or blocks is not None else None
    if not _on_meta(model):
        model.to(torch.device("cpu") if cpu_offload else ctx.device)
        _broadcast_from_rank0(model)
    if tp_plan:
        apply_tp(model, ctx.dims.mesh("tp"), tp_plan)
    if ac_mode != "none":
        apply_ac(found, ac_mode, ac_every)
    if compile:
        apply_compile(found, compile_backend)
    if layout in ("fsdp", "hsdp"):
        mesh = ctx.dims.mesh("fsdp") if layout == "hsdp" else ctx.dims.mesh("dp")
        apply_fsdp(
            model,
            found,
            mesh,
            reshard_after_forward,
            param_dtype,
            cpu_offload,
            pin_memory=ctx.device.type == "cuda",
        )
    elif layout == "ddp":
        model = _replicate(model, ctx)
    return model


def _replicate(model: nn.Module, ctx) -> nn.Module:
    """Data-parallel replication: DDP, or where DDP cannot work, FSDP2's replicate (pipeline stages: a
    schedule's several forwards before their backwards break DDP's bucket rebuilding) or the replica
    gradient sync (tensor parallel: DDP takes no DTensors)."""
    mesh = ctx.dims.mesh("dp")
    if ctx.dims.pp > 1:
        apply_replicate(model, mesh)
        return model
    if ctx.dims.tp > 1:
        return sync_replica_gradients(model, mesh)
    return apply_ddp(model, mesh, ctx.device)


def _on_meta(model: nn.Module) -> bool:
    return any(t.device.type == "meta" for t in list(model.parameters()) + list(model.buffers()))


def _resolve_layout(layout: str, ctx) -> str:
    """The layout to apply: 'auto' resolved from ctx.dims; 'none' when there is one data-parallel rank."""
    if layout not in LAYOUTS:
        raise ConfigError(
            f"parallelize(layout={layout!r}): not one of {', '.join(LAYOUTS)}", "use layout='auto'"
        )
    dims = ctx.dims
    if layout == "auto":
        layout = "hsdp" if dims.hsdp else "fsdp" if dims.fsdp else "ddp" if dims.dp > 1 else "none"
    if layout == "hsdp" and not dims.hsdp:
        raise ConfigError(
            f"parallelize(layout='hsdp') needs dp_replicate > 1 and dp_shard > 1, but ctx has "
            f"{dims.describe()}",
            "start with exatrain.init(dp_shard=S, dp_replicate=R), R x S = the number of ranks",
        )
    return layout


def _ac_mode(value) -> tuple[str, int]:
    if value is False or value is None or value == "none":
        return "none", 1
    if value is True or value == "full":
        return "full", 1
    if isinstance(value, int) and value >= 1:
        return ("full", 1) if value == 1 else ("every", value)
    raise ConfigError(
        f"parallelize(activation_checkpoint={value!r}): expected False, 'full' or an int k >= 1",
        "use activation_checkpoint='full' (every block) or e.g. 2 (every second block)",
    )


@torch.no_grad()
def _broadcast_from_rank0(model: nn.Module) -> None:
    """Make every rank's weights rank 0's (DDP does this too; FSDP shards each rank's own copy)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    nccl = dist.get_backend() == "nccl"
    for t in list(model.parameters()) + list(model.buffers()):
        if not (nccl and t.device.type == "cpu"):  # CPU offload under nccl: DDP/FSDP users keep them equal
            dist.broadcast(t.data, src=0)
