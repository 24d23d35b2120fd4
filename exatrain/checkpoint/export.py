"""One-file exports of a checkpoint's model, and seeding a model from such a file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from exatrain.checkpoint.compatibility import require_match
from exatrain.checkpoint.store import MARKER, is_complete
from exatrain.errors import ExatrainError


def export_model(checkpoint: str | Path, out_file: str | Path) -> Path:
    """Write the model of a DCP checkpoint as one plain state dict file (no process group needed).

    The result loads into a single-process model with `torch.load(..., weights_only=True)`.
    """
    src, out = Path(checkpoint), Path(out_file)
    if not src.is_dir() or not is_complete(src):
        raise ExatrainError(
            f"{src} is not a complete checkpoint (a step-N folder with {MARKER} and .metadata)",
            "pass a folder like RUN_DIR/checkpoints/step-100",
        )
    if not out.parent.is_dir():
        raise ExatrainError(
            f"export target directory {out.parent} does not exist",
            f"create it first (mkdir -p {out.parent}) or choose another output path",
        )
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".export-") as tmp:
        whole = Path(tmp) / "whole.pt"
        dcp_to_torch_save(str(src), str(whole))
        state = torch.load(whole, weights_only=True)["app"]
        staged = Path(tmp) / "model.pt"
        torch.save(state["model"], staged)
        os.replace(staged, out)
    return out


def load_model_file(model: torch.nn.Module, path: str | Path) -> None:
    """Seed a plain model from a full state dict file, after checking names and shapes."""
    p = Path(path)
    if not p.is_file():
        raise ExatrainError(
            f"model file {p} does not exist", "export one with `exatrain checkpoint export CKPT FILE`"
        )
    state = torch.load(p, map_location="cpu", weights_only=True)
    require_match(model, {k: tuple(v.shape) for k, v in state.items()}, f"model file {p}")
    model.load_state_dict(state)
