"""The metrics log a run leaves in its directory (JSONL, written by rank 0); its JSON reports are written
whole by exatrain.files."""

from __future__ import annotations

import json
from pathlib import Path

from exatrain.observe.rank import is_rank0


class MetricsLog:
    """Appends one JSON object per line to `path` (rank 0 only; other ranks write nothing).

    A new log starts empty; `resume_step=N` (a run resumed from step N) keeps the records up to step N
    and drops later ones, which the resumed run recomputes.
    """

    def __init__(self, path: str | Path, enabled: bool | None = None, resume_step: int | None = None):
        self.enabled = is_rank0() if enabled is None else enabled
        self.path = Path(path)
        if self.enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            kept = []
            if resume_step is not None and self.path.exists():
                kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def write(self, **record) -> None:
        """Record one event, e.g. write(step=3, loss=4.2) or write(kind="eval", step=3, loss=4.0)."""
        if self.enabled:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")


def read_metrics(path: str | Path) -> list[dict]:
    """All records of a metrics.jsonl file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


class MetricsFanout:
    """Sends each record to several logs (metrics.jsonl, TensorBoard, ...): write(**record), close()."""

    def __init__(self, *logs):
        self.logs = logs

    def write(self, **record) -> None:
        """Record one event in every log."""
        for log in self.logs:
            log.write(**record)

    def close(self) -> None:
        """Close the logs that need it (flushes TensorBoard's event file)."""
        for log in self.logs:
            if hasattr(log, "close"):
                log.close()
