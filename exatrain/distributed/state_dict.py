"""The whole model as one plain state dict, whatever wraps or shards it (DDP, FSDP2, TP)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Gather `model`'s parameters and buffers into plain CPU tensors on rank 0 ({} on other ranks).

    A collective under a process group: call it on every rank. Names are the plain model's (no `module.`
    prefix of DDP, no activation-checkpoint wrapper names), so the dict loads into an unwrapped model.
    Without a process group: a CPU copy of the state dict."""
    if not dist.is_initialized():
        state = get_model_state_dict(model)
        return {k: v.detach().cpu().clone() for k, v in state.items()}
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
