"""Moved to exatrain.observe.progress (this path keeps working)."""

from exatrain.observe.progress import Progress, ProgressReporter

__all__ = ["Progress", "ProgressReporter"]
