"""Checkpoints of a DeepSpeed engine through DeepSpeed's own save/load, in exatrain's run layout: what
`exatrain.Checkpointer(..., model=ds_engine)` uses (the trainer's `[engine] name = "deepspeed"` too).

RUN_DIR/checkpoints/step-N is committed exactly like a DCP checkpoint (checkpoint/store.py): every rank writes
its ZeRO shards into `.step-N.partial/` (DeepSpeed's tag folder `deepspeed/`, its `latest` file), rank 0
adds `exatrain.json` (step, world size, ZeRO stage) and the commit marker, renames the folder, and retires
all but the newest `keep`. Resume=auto finds the newest committed one. The training progress (step, tokens,
best eval loss, the sampler's global position) travels in DeepSpeed's client state.

DeepSpeed's ZeRO shards are tied to the number of ranks that wrote them: resuming with another world size
goes through DeepSpeed's universal checkpoint (universal.py: converted once into step-N/universal)
for the ZeRO stages where that works (UNIVERSAL_STAGES), and is refused with a HINT for the others.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from exatrain.checkpoint.checkpointer import register_manager
from exatrain.checkpoint.manager import CheckpointManager
from exatrain.checkpoint.store import commit, delete, partial_dir, retire, step_dir
from exatrain.distributed import barrier, is_root, print0
from exatrain.engines.deepspeed.universal import ensure_universal, loading_universal
from exatrain.errors import ExatrainError

TAG = "deepspeed"  # DeepSpeed's checkpoint tag: the folder its files go into inside step-N
INFO = "exatrain.json"
#: ZeRO stages whose checkpoints resume at another world size through DeepSpeed's universal checkpoint
UNIVERSAL_STAGES = (1, 2)


class DeepSpeedCheckpoints:
    """The Checkpointer's manager for a DeepSpeed engine (`ds`, deepspeed.initialize's first result); every
    rank calls every method."""

    def __init__(self, root: Path, interval: int, keep: int, ds, get_progress, set_progress, world_size: int):
        self.root, self.interval, self.keep = Path(root), interval, keep
        self.ds, self.zero_stage = ds, int(ds.zero_optimization_stage())
        self.get_progress, self.set_progress = get_progress, set_progress
        self.world_size = world_size
        self.resumed_from: Path | None = None
        self.on_commit = None  # called on rank 0 with each committed checkpoint's path

    # the same start as exatrain's DCP checkpoints: clean killed saves (rank 0), then pick the one to resume
    start = CheckpointManager.start

    def save(self, step: int, state=None, blocking: bool = True) -> Path:
        """Write step-N with DeepSpeed on every rank, then rank 0 commits it and prunes old ones."""
        partial, final = partial_dir(self.root, step), step_dir(self.root, step)
        self.ds.save_checkpoint(str(partial), tag=TAG, client_state={"exatrain": self.get_progress()})
        barrier()  # every rank's shards are on disk
        if is_root():
            info = {"step": step, "world_size": self.world_size, "zero_stage": self.zero_stage}
            (partial / INFO).write_text(json.dumps(info) + "\n")
            commit(partial, final)
            if self.on_commit is not None:
                self.on_commit(final)
            delete(retire(self.root, self.keep, protect=self.resumed_from))
        barrier()
        return final

    def load(self, path: Path, state=None, **_) -> None:
        """Restore model, ZeRO optimizer shards, schedule and progress from a step-N folder; from its
        universal conversion when the world size differs."""
        info = read_info(path)
        problem = _mismatch(info, self.world_size, self.zero_stage)
        if problem:
            raise ExatrainError(
                f"checkpoint {path}: {problem}; DeepSpeed's ZeRO-{info.get('zero_stage')} shards "
                "load only into the same layout",
                f"resume with {info.get('world_size')} rank(s) and --engine.zero_stage="
                f"{info.get('zero_stage')}, or export its weights with DeepSpeed's script "
                f"(python {path}/zero_to_fp32.py {path} OUT_DIR) and start a new run from them",
            )
        universal = info.get("world_size") != self.world_size
        load_dir = path
        if universal:
            load_dir = ensure_universal(path, TAG)
            print0(
                f"checkpoint {path} was written by {info.get('world_size')} rank(s): loading its "
                "conversion to "
                f"DeepSpeed's universal checkpoint ({load_dir}) into {self.world_size} rank(s)"
            )
        with loading_universal(self.ds, universal):
            _, client = self.ds.load_checkpoint(
                str(load_dir), tag=TAG, load_optimizer_states=True, load_lr_scheduler_states=True
            )
        if client is None or "exatrain" not in client:
            raise ExatrainError(
                f"checkpoint {path}: DeepSpeed found no training state in it",
                "resume from another step-N folder, or start fresh (--checkpoint.resume='')",
            )
        self.set_progress(client["exatrain"])

    def poll(self, device=None) -> None:
        """Saves are synchronous: nothing to commit in the background."""

    def wait(self) -> None:
        """Saves are synchronous: nothing in flight."""

    def finish_pruning(self) -> None:
        """Pruning is synchronous: nothing to wait for."""


def read_info(path: Path) -> dict:
    """What exatrain recorded about a DeepSpeed checkpoint; a clear error for a checkpoint of another
    engine."""
    try:
        return json.loads((Path(path) / INFO).read_text())
    except FileNotFoundError:
        raise ExatrainError(
            f"checkpoint {path} was not written by the deepspeed engine (no {INFO})",
            "resume it with the engine that wrote it (engine.name=torch), or start fresh",
        ) from None


def _mismatch(info: dict, world_size: int, zero_stage: int) -> str:
    """Why this run cannot load the checkpoint described by `info` ("" when it can)."""
    if info.get("zero_stage") != zero_stage:
        return f"saved with ZeRO stage {info.get('zero_stage')}, this run uses stage {zero_stage}"
    if info.get("world_size") != world_size and zero_stage not in UNIVERSAL_STAGES:
        return (
            f"saved by {info.get('world_size')} rank(s), this run has {world_size}, and "
            "DeepSpeed's universal "
            f"checkpoint does not reshard ZeRO stage {zero_stage} here (see docs/engines.md)"
        )
    return ""


def is_deepspeed_engine(model) -> bool:
    """True for deepspeed.initialize's engine (without importing DeepSpeed when the caller did not)."""
    deepspeed = sys.modules.get("deepspeed.runtime.engine")
    return deepspeed is not None and isinstance(model, deepspeed.DeepSpeedEngine)


def _manager(root: Path, interval: int, keep: int, ds, world_size: int):
    return lambda get, restore: DeepSpeedCheckpoints(root, interval, keep, ds, get, restore, world_size)


register_manager(is_deepspeed_engine, _manager)
