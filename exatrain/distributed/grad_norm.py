"""Gradient-norm clipping over the FULL model when parameters are sharded in different ways.

torch's `clip_grad_norm_` runs one foreach kernel over all gradients; that fails as soon as plain
tensors and DTensors mix (tensor parallel leaves norms plain) or DTensors live on different meshes
(FSDP on 'dp_shard' vs FSDP x TP on ('dp_shard', 'tp')). Here gradients are grouped by mesh; each
group's norm is made global with one collective (DTensor `full_tensor`), and pipeline stages add
their squared norms over the 'pp' mesh.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.experimental import implicit_replication


@torch.no_grad()
def clip_grad_norm_(parameters, max_norm: float, ctx=None, *, pp_mesh=None) -> torch.Tensor:
    """`exatrain.clip_grad_norm_`: scale gradients so the global L2 norm of the WHOLE model's gradients is at
    most `max_norm`; returns that norm before clipping (a 0-d tensor, the same on every rank).

    `torch.nn.utils.clip_grad_norm_` for every layout: it fails when plain tensors and DTensors mix (TP)
    or DTensors live on different meshes (FSDP x TP), and it cannot see the other pipeline stages'
    parameters. `parameters`: a module, a list of modules (this rank's pipeline stages) or parameters.
    `ctx` (the Context of exatrain.init): with a pipeline dimension, the stages' squared norms are summed
    over it (or pass the pipeline mesh as `pp_mesh`). Plain (non-DTensor) gradients count once: they are
    identical on the ranks that hold them (DDP replicas after the all-reduce, TP ranks for replicated
    parameters)."""
    if pp_mesh is None and ctx is not None:
        pp_mesh = ctx.dims.mesh("pp")
    groups = defaultdict(list)
    for p in _parameters(parameters):
        if p.grad is not None:
            groups[p.grad.device_mesh if isinstance(p.grad, DTensor) else None].append(p)
    if not groups:
        return torch.zeros(())
    squares = []
    for params in groups.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type=2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()  # the norm of the whole (unsharded) tensors
        squares.append(norm.float() ** 2)
    total_sq = torch.stack(squares).sum()
    if pp_mesh is not None:
        dist.all_reduce(total_sq, group=pp_mesh.get_group())
    total = total_sq.sqrt()
    with implicit_replication():  # lets a plain scalar scale DTensor gradients
        for params in groups.values():
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def _parameters(items):
    """The parameters of a module, of a list of modules, or the given parameters."""
    if isinstance(items, torch.nn.Module):
        return list(items.parameters())
    return [p for item in items for p in (item.parameters() if isinstance(item, torch.nn.Module) else [item])]
