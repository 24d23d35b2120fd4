"""Moved to exatrain.observe.progress (this path keeps working; Progress is exatrain.Progress)."""

import exatrain
from exatrain.observe.progress import ProgressReporter

Progress = exatrain.Progress

__all__ = ["Progress", "ProgressReporter"]
