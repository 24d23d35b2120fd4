"""Compare what a checkpoint or model file holds with the model at hand, before loading anything."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from exatrain.errors import ExatrainError


def mismatches(expected: dict[str, tuple], found: dict[str, tuple]) -> list[str]:
    """Human-readable differences between two {name: shape} maps (missing, unexpected, wrong shape)."""
    out = [f"missing: {k}" for k in sorted(set(expected) - set(found))]
    out += [f"unexpected: {k}" for k in sorted(set(found) - set(expected))]
    out += [
        f"shape of {k}: checkpoint {tuple(found[k])} vs model {tuple(expected[k])}"
        for k in sorted(set(expected) & set(found))
        if tuple(found[k]) != tuple(expected[k])
    ]
    return out


def model_shapes(model: torch.nn.Module) -> dict[str, tuple]:
    """{parameter/buffer name: shape} of a plain (unsharded) model."""
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def read_metadata(path: Path) -> Metadata:
    """A DCP checkpoint's metadata (names, shapes and types of everything in it)."""
    try:
        return FileSystemReader(str(path)).read_metadata()
    except Exception as e:  # torch raises several types for a damaged file
        raise ExatrainError(
            f"cannot read checkpoint metadata in {path} ({type(e).__name__}: {e})",
            "the checkpoint is damaged: resume from an earlier step-N folder or --checkpoint.resume=auto",
        ) from None


def checkpoint_model_shapes(meta: Metadata, prefix: str = "app.model.") -> dict[str, tuple]:
    """{name: global shape} of the model tensors recorded in a DCP checkpoint's metadata."""
    return {
        k[len(prefix) :]: tuple(m.size)
        for k, m in meta.state_dict_metadata.items()
        if k.startswith(prefix) and isinstance(m, TensorStorageMetadata)
    }


def require_match(model: torch.nn.Module, found: dict[str, tuple], source: str) -> None:
    """Fail with the full list of differences when `source` does not fit the model."""
    require_shapes(model_shapes(model), found, source)


_HINT = (
    "use the model.size and data settings (vocabulary, seq_len) the checkpoint was made with; "
    "its config.toml is stored inside it (exatrain checkpoint export shows it)"
)


def require_shapes(
    expected: dict[str, tuple], found: dict[str, tuple], source: str, hint: str = _HINT
) -> None:
    """Fail with the full list of differences when `source` does not hold exactly `expected`."""
    diff = mismatches(expected, found)
    if diff:
        shown = "\n  ".join(diff[:20]) + (f"\n  ... and {len(diff) - 20} more" if len(diff) > 20 else "")
        raise ExatrainError(f"{source} does not match the model:\n  {shown}", hint)
