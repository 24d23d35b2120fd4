"""The whole training state as one DCP `Stateful`: model, optimizer, LR schedule, progress, config.

Model and optimizer go through torch's get/set_state_dict, which yields sharded entries for sharded
models and plain ones for DDP, so the same checkpoint loads under another world size (DCP reshards).
Progress (step, tokens, the sampler's position in global samples, best eval loss) is plain Python data.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful


class TrainingState(Stateful):
    """What a checkpoint holds; `get_progress`/`set_progress` connect it to the trainer's counters."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler,
                 get_progress: Callable[[], dict], set_progress: Callable[[dict], None], config_text: str):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.get_progress, self.set_progress = get_progress, set_progress
        self.config_text = config_text

    def state_dict(self) -> dict:
        model, optim = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optim": optim, "scheduler": self.scheduler.state_dict(),
                "progress": self.get_progress(), "config": self.config_text}

    def load_state_dict(self, state: dict) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.set_progress(state["progress"])
