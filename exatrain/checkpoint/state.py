"""The whole training state as DCP `Stateful`s: model, optimizer, LR schedule, progress, config, RNG.

Model and optimizer go through torch's get/set_state_dict, which yields sharded entries for sharded
models and plain ones for DDP, so the same checkpoint loads under another world size (DCP reshards).
Progress (step, tokens, the sampler's position in global samples, best eval loss) is plain Python data.

Random generators are per rank (dropout masks differ between data-parallel replicas), so each rank saves
its own under a top-level key of its own, `rng-rank-R`, together with the parallel layout it ran in. On
resume in the same layout (world size and degrees), every rank continues its generators exactly, so the
run repeats the uninterrupted one, dropout included. In another layout, rank R of the new run is not the
same part of the computation as rank R was (another data share, another TP/PP position), so no generator
is restored and the trainer reseeds each rank deterministically from the seed, its data-parallel rank and
the step.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful


class TrainingState(Stateful):
    """What a checkpoint holds; `get_progress`/`set_progress` connect it to the trainer's counters.
    `optimizer` and `scheduler` may be None (then they are neither saved nor loaded)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        scheduler,
        get_progress: Callable[[], dict],
        set_progress: Callable[[dict], None],
        config_text: str,
        rank: int = 0,
        device: torch.device | None = None,
        layout: str = "",
    ):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.get_progress, self.set_progress = get_progress, set_progress
        self.config_text = config_text
        self.rng = RngState(rank, device or torch.device("cpu"), layout)

    def entries(self, saved_keys: Iterable[str] | None = None) -> dict[str, Stateful]:
        """What DCP saves, or (given the checkpoint's flattened keys) what it can load: this rank's RNG
        only when the checkpoint has it."""
        if saved_keys is None:
            return {"app": self, self.rng.key: self.rng}
        found = {k[len(self.rng.key) + 1 :] for k in saved_keys if k.startswith(self.rng.key + ".")}
        if not found:
            return {"app": self}
        self.rng.expect(found)
        return {"app": self, self.rng.key: self.rng}

    def state_dict(self) -> dict:
        state = {"progress": self.get_progress(), "config": self.config_text}
        if self.optimizer is None:
            state["model"] = get_model_state_dict(self.model)
        else:
            state["model"], state["optim"] = get_state_dict(self.model, self.optimizer)
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if self.optimizer is None:
            set_model_state_dict(self.model, state["model"])
        else:
            set_state_dict(
                self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
            )
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.set_progress(state["progress"])


class RngState(Stateful):
    """One rank's generators: torch on the CPU and on its GPU (if any), NumPy's global one, Python's `random`;
    restored only into the same `layout` (a description of world size and parallel degrees).

    Everything is stored as tensors, ints, floats, strings and tuples, so a checkpoint still loads with
    `torch.load(..., weights_only=True)` after `dcp_to_torch_save`.
    """

    def __init__(self, rank: int, device: torch.device, layout: str = ""):
        self.key, self.device, self.layout = f"rng-rank-{rank}", device, layout
        self.restored = False
        self._expected: set[str] | None = None  # when loading: the parts the checkpoint has

    def expect(self, parts: set[str]) -> None:
        """Before a load: restore only these parts (e.g. no 'cuda' in a checkpoint written on CPUs)."""
        self._expected = parts

    def state_dict(self) -> dict:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        state = {
            "layout": self.layout,
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": (name, tuple(int(k) for k in keys), int(pos), int(has_gauss), float(cached)),
        }
        if self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        if self._expected is not None:
            state = {k: v for k, v in state.items() if k in self._expected}
        return state

    def load_state_dict(self, state: dict) -> None:
        self._expected = None
        if state.get("layout") != self.layout:
            return  # another layout: the trainer reseeds
        if "torch" in state:
            torch.set_rng_state(state["torch"])
        if "python" in state:
            random.setstate(_as_tuples(state["python"]))
        if "numpy" in state:
            name, keys, pos, has_gauss, cached = state["numpy"]
            np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
        if "cuda" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda"], self.device)
        self.restored = True


def _as_tuples(value):
    """random.setstate wants tuples all the way down; a round trip may have turned some into lists."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value
