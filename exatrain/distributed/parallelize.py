"""Apply a parallel layout to a model: tensor parallel, activation checkpointing, compile, FSDP / DDP.

Model-agnostic: the caller passes the container of the model's repeated blocks (an `nn.ModuleDict`,
e.g. `model.layers`) and the model's tensor-parallel plan (which lives next to the model). Works on a
whole model or on one pipeline stage's chunk of it (a module with a subset of the blocks, with or
without embeddings and output head).

Use on a model built on the meta device; materialise (`to_empty`) and load weights afterwards
(`load_full_state_dict`); wrap with DDP (`apply_ddp`) only after that, since DDP broadcasts rank 0's
real weights when it is constructed.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import parallelize_module
from torch.nn.parallel import DistributedDataParallel

from exatrain.config import ParallelConfig
from exatrain.distributed.collective_waits import time_fsdp_waits, time_tp_waits

DTYPES = {"fp32": None, "bf16": torch.bfloat16}


def parallelize(
    model: nn.Module, blocks: nn.ModuleDict, dims, cfg: ParallelConfig, tp_plan: dict | None, device_type: str
) -> nn.Module:
    """Apply the layout of `dims` (a ParallelDims with its mesh built) to `model` in place, in the one
    order that works, and return it.

    The order matters:
    1. Tensor parallel first: it replaces parameters with DTensors sharded on the 'tp' mesh, and its
       plan names modules by their original paths (`layers.0.attention.wq`), which wrapping would change.
    2. Activation checkpointing wraps each block, so recomputation covers the block's TP collectives.
    3. torch.compile per block, after AC, so the compiled region includes the checkpoint boundary and
       each block is compiled once (identical blocks reuse the compiled code).
    4. FSDP last: fully_shard turns the (TP-sharded) parameters into DTensors over the data-parallel
       mesh as well (2-D with TP), and its hooks must run around the wrapped, compiled blocks.
    DDP is also "last", but needs real weights: see `apply_ddp`.
    """
    if dims.tp_enabled and tp_plan:
        apply_tp(model, dims.mesh("tp"), tp_plan)
    if cfg.activation_checkpoint != "none":
        apply_ac(blocks, cfg.activation_checkpoint, cfg.activation_checkpoint_every)
    if cfg.compile:
        apply_compile(blocks, cfg.compile_backend)
    if dims.fsdp:
        apply_fsdp(
            model,
            blocks,
            dims.mesh("fsdp"),
            cfg.fsdp_reshard_after_forward,
            DTYPES[cfg.param_dtype],
            cfg.cpu_offload,
            pin_memory=device_type == "cuda",
        )
    return model


def apply_tp(module: nn.Module, tp_mesh, plan: dict) -> None:
    """Shard `module` along `tp_mesh` with `plan` ({module path: ParallelStyle}); entries naming modules
    this module lacks (e.g. the output head on a first pipeline stage) are skipped."""
    present = dict(module.named_modules())
    time_tp_waits()  # lets the straggler accounting tell a slow rank from those waiting for it
    parallelize_module(module, tp_mesh, {name: style for name, style in plan.items() if name in present})


def apply_ac(blocks: nn.ModuleDict, mode: str, every: int = 1) -> None:
    """Recompute activations in backward: every block (mode 'full') or every `every`-th ('every').

    The wrapper keeps parameter names in state dicts unchanged (torch strips its prefix). The RNG state
    is saved so that recomputation draws the same dropout masks as the forward did."""
    for i, (name, block) in enumerate(list(blocks.items())):
        if mode == "full" or (mode == "every" and i % every == 0):
            blocks[name] = checkpoint_wrapper(block, preserve_rng_state=True)


def apply_compile(blocks: nn.ModuleDict, backend: str) -> None:
    """torch.compile each block in place (`Module.compile` keeps names; blocks share compiled code)."""
    for block in blocks.values():
        block.compile(backend=backend, fullgraph=False)


def apply_fsdp(
    model: nn.Module,
    blocks: nn.ModuleDict,
    mesh,
    reshard_after_forward: bool,
    param_dtype: torch.dtype | None,
    cpu_offload: bool,
    pin_memory: bool = True,
) -> None:
    """FSDP2: shard each block, then the root (the remaining parameters: embeddings, norm, output).

    One fully_shard per block lets FSDP gather one block's parameters at a time and overlap the next
    gather with compute. A 2-D mesh (dp_replicate, dp_shard) gives HSDP: sharded within a group,
    replicated (gradients all-reduced) across groups. bf16 `param_dtype` computes in bf16 but reduces
    gradients in fp32. CPU offload pins memory only on GPU machines (pinning needs an accelerator).
    """
    options = {
        "mesh": mesh,
        "mp_policy": MixedPrecisionPolicy(
            param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None
        ),
        "offload_policy": CPUOffloadPolicy(pin_memory=pin_memory) if cpu_offload else OffloadPolicy(),
    }
    time_fsdp_waits()  # lets the straggler accounting tell a slow rank from those waiting for it
    names = list(blocks.keys())
    for i, name in enumerate(names):
        # the last block's parameters are needed again right away by backward: keep them gathered
        keep = reshard_after_forward and i < len(names) - 1
        fully_shard(blocks[name], reshard_after_forward=keep, **options)
    fully_shard(model, reshard_after_forward=reshard_after_forward, **options)


def apply_ddp(model: nn.Module, dp_mesh, device: torch.device) -> nn.Module:
    """Wrap a materialised model in DDP over `dp_mesh`'s process group (replicas all-reduce gradients,
    overlapped with backward). Not for tensor-parallel models: see `all_reduce_gradients`.

    Call after the weights are loaded: DDP's constructor broadcasts rank 0's parameters."""
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, process_group=dp_mesh.get_group(), device_ids=device_ids)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole value of a DTensor on every rank (collective), gathered one mesh dimension at a time.

    DTensor's own full_tensor() gathers a tensor sharded on two mesh dimensions (FSDP x TP:
    (_StridedShard(0), Shard(0))) in one multi-dimensional redistribution that it cannot merge, and warns
    on every rank that it "may give inconsistent results between ranks". One single-dimension all_gather
    per mesh dimension, outermost first, gives the same bits without that path."""
    if not isinstance(t, DTensor):
        return t
    placements = list(t.placements)
    for dim, placement in enumerate(placements):
        if not placement.is_replicate():
            placements[dim] = Replicate()
            t = t.redistribute(t.device_mesh, placements)
    return t.to_local()


def gathered_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """`module`'s state dict with every (FSDP/TP-sharded) tensor gathered whole, as CPU tensors, on every
    rank (collective over the module's mesh)."""
    return {k: full_tensor(v).detach().cpu() for k, v in module.state_dict().items()}


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (a shard, or the whole value when replicated); a plain tensor as is."""
    return t.to_local() if isinstance(t, DTensor) else t


@torch.no_grad()
def all_reduce_gradients(params, dp_mesh) -> None:
    """Average gradients over `dp_mesh`'s ranks with one collective on a flat buffer.

    Replication for layouts torch's DDP cannot wrap: it takes no DTensor parameters, so replicas of a
    tensor-parallel model reduce their local gradient shards here, after the last backward of a step."""
    grads = [local_tensor(p.grad) for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=dp_mesh.get_group())
    flat /= dp_mesh.size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
