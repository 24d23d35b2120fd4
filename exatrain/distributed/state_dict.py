"""The whole model as one plain state dict, whatever wraps or shards it (DDP, FSDP2, TP)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.tensor import DTensor

from exatrain.distributed.parallelize import full_tensor


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Gather `model`'s parameters and buffers into plain CPU tensors on rank 0 ({} on other ranks).

    A collective under a process group: call it on every rank. Names are the plain model's (no `module.`
    prefix of DDP, no activation-checkpoint wrapper names), so the dict loads into an unwrapped model.
    Without a process group: a CPU copy of the state dict."""
    state = get_model_state_dict(model)  # the plain model's names; DTensors where sharded
    if not dist.is_initialized():
        return {k: v.detach().cpu().clone() for k, v in state.items()}
    # one mesh dimension at a time (full_tensor): torch's own full-state-dict gather of FSDP x TP parameters
    # warns on every rank that it "may give inconsistent results"; every rank takes part in each gather
    root = dist.get_rank() == 0
    full = {}
    for k, v in state.items():
        whole = full_tensor(v)
        if root:
            full[k] = whole.detach().cpu()
    return full


def load_full_state_dict(model: nn.Module, state: dict[str, torch.Tensor], device: torch.device) -> None:
    """`exatrain.load_full_state_dict`: fill a parallelised model from a whole (unsharded) state dict that
    every rank holds, the counterpart of `full_state_dict`; each rank copies out only its own FSDP/TP shards
    (no communication). A model on the meta device (built without memory, then `exatrain.parallelize`d) is
    materialised on `device` first. Keys the model lacks are ignored (a pipeline stage takes its layers
    from the whole model's dict)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model.to_empty(device=device)
    own = model.state_dict().keys()
    mine = {k: v for k, v in state.items() if k in own}
    if any(isinstance(p, DTensor) for p in model.parameters()):
        set_model_state_dict(model, mine, options=StateDictOptions(full_state_dict=True))
    else:
        model.load_state_dict(mine)
