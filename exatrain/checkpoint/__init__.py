"""Distributed checkpoints (DCP) of the whole training state, atomic commit, retention, export."""

from exatrain.checkpoint.export import export_model, load_model_file
from exatrain.checkpoint.manager import CheckpointManager
from exatrain.checkpoint.state import TrainingState
from exatrain.checkpoint.store import complete_checkpoints, latest

__all__ = [
    "CheckpointManager",
    "TrainingState",
    "complete_checkpoints",
    "export_model",
    "latest",
    "load_model_file",
]
