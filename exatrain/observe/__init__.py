"""What a run reports: the metrics log (JSONL, rank 0) and the progress line or bar.

Between launch and distributed in the layer order: it may use torch.distributed to know whether this is
rank 0, but sets nothing up.
"""

from exatrain._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["MetricsLog", "read_metrics"], "exatrain.observe.metrics"),
    "write_json": "exatrain.files",  # the run's JSON reports (summary.json), written atomically
    **dict.fromkeys(["Progress", "ProgressReporter"], "exatrain.observe.progress"),
    "StepMetrics": "exatrain.observe.step_metrics",  # imports torch: loaded on first use only
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
