"""What a run leaves in its directory: config, metrics (JSONL), per-rank reports and a summary."""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

DIGEST_MOD = 2 ** 32


def samples_digest(batches) -> int:
    """Order-free digest of the samples (rows) of token tensors `batches`: the sum of each row's CRC-32,
    modulo 2**32. Summed over the data-parallel ranks (exact in float64) and taken modulo 2**32 again, it
    names a step's global batch whatever the world size, so metrics.jsonl shows what was really trained on."""
    total = 0
    for x in batches:
        for row in x.numpy():
            total += zlib.crc32(row.tobytes())
    return total % DIGEST_MOD


def write_json(path: Path, data: dict) -> None:
    """Write JSON atomically (temp file then rename), so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


class MetricsLog:
    """Appends one JSON object per line to RUN_DIR/metrics.jsonl (rank 0 only)."""

    def __init__(self, path: Path, enabled: bool, resume_step: int | None = None):
        self.enabled = enabled
        self.path = path
        if enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
            # a resumed run keeps the records up to its checkpoint; later ones are recomputed
            kept = [r for r in read_metrics(path) if r["step"] <= resume_step] if resume_step is not None and path.exists() else []
            path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def write(self, **record) -> None:
        """Record one event, e.g. write(kind="train", step=3, loss=4.2)."""
        if self.enabled:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")


def read_metrics(path: Path) -> list[dict]:
    """All records of a metrics.jsonl file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
