"""Files written whole or not at all: a temporary file beside the target, then one rename.

A reader polling for a file (the hang watcher reading other ranks' beats, the launcher reading stack dumps,
a user's `cat summary.json`) then never sees half of it. The temporary name carries the writer's pid, so
two processes writing the same file (two ranks writing diagnosis.txt) never share one. Stdlib only, at the
bottom of the layers: every layer may use it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` atomically (temporary file, then rename), creating its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: str | Path, data: dict) -> None:
    """Write `data` as indented JSON with sorted keys, atomically (write_text)."""
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_json(path: str | Path) -> dict | None:
    """The JSON object in `path`, or None when the file is missing or not JSON (yet)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
