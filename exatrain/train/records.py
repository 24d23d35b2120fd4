"""Moved to exatrain.observe.metrics (this path keeps working)."""

from exatrain.observe.metrics import MetricsLog, read_metrics, write_json

__all__ = ["MetricsLog", "read_metrics", "write_json"]
