"""What a run reports: the metrics log (JSONL, rank 0) and the progress line or bar.

Between launch and distributed in the layer order: it may use torch.distributed to know whether this is
rank 0, but sets nothing up.
"""

from exatrain.observe.metrics import MetricsLog, read_metrics, write_json
from exatrain.observe.progress import Progress, ProgressReporter

__all__ = ["MetricsLog", "Progress", "ProgressReporter", "StepMetrics", "read_metrics", "write_json"]


def __getattr__(name: str):
    # StepMetrics imports torch: loaded on first use only
    if name == "StepMetrics":
        from exatrain.observe.step_metrics import StepMetrics

        return StepMetrics
    raise AttributeError(f"module 'exatrain.observe' has no attribute {name!r}")
