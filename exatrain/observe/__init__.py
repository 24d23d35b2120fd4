"""What a run reports: the metrics log (JSONL, rank 0) and the progress line or bar.

Between launch and distributed in the layer order: it may use torch.distributed to know whether this is
rank 0, but sets nothing up.
"""

from exatrain.observe.metrics import MetricsLog, read_metrics, write_json
from exatrain.observe.progress import Progress, ProgressReporter

__all__ = ["MetricsLog", "Progress", "ProgressReporter", "read_metrics", "write_json"]
