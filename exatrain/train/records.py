"""Moved to exatrain.observe.metrics (this path keeps working; MetricsLog is exatrain.MetricsLog)."""

import exatrain
from exatrain.observe.metrics import read_metrics, write_json

MetricsLog = exatrain.MetricsLog

__all__ = ["MetricsLog", "read_metrics", "write_json"]
