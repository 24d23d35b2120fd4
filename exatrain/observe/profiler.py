"""Per-rank profiling: torch.profiler traces of chosen ranks and steps, rank-unique files in RUN_DIR/profile/.

Configured by the [profiler] section (ranks like "0,last", "every:4" or "all"; steps "A-B"); off when no
rank is chosen, and then free: `begin`/`end` compare one integer. A trace is a Chrome trace JSON file
(open it in https://ui.perfetto.dev or chrome://tracing); with memory_snapshot on a GPU, a CUDA memory
snapshot pickle of the same steps sits next to it (https://pytorch.org/memory_viz).
"""

from __future__ import annotations

import socket
from pathlib import Path

from exatrain.errors import ConfigError


def parse_ranks(spec: str, world_size: int) -> frozenset[int]:
    """The ranks a `profiler.ranks` value chooses: "" (none), "all", "every:K", or a list of ranks and
    "last"."""
    spec = spec.strip()
    if not spec:
        return frozenset()
    if spec == "all":
        return frozenset(range(world_size))
    if spec.startswith("every:"):
        k = _positive_int(spec.removeprefix("every:"), spec)
        return frozenset(range(0, world_size, k))
    ranks = set()
    for item in (s.strip() for s in spec.split(",")):
        r = world_size - 1 if item == "last" else _int(item, spec)
        if not 0 <= r < world_size:
            raise ConfigError(
                f"profiler.ranks={spec!r}: rank {r} does not exist in a job of {world_size} rank(s)",
                f"choose ranks from 0 to {world_size - 1} (or 'last')",
            )
        ranks.add(r)
    return frozenset(ranks)


def parse_steps(spec: str) -> tuple[int, int]:
    """(first, last) optimizer steps of a `profiler.steps` value "A-B" or "A" (1-based, inclusive)."""
    first, _, last = spec.strip().partition("-")
    a = _positive_int(first, spec, key="profiler.steps")
    b = _positive_int(last, spec, key="profiler.steps") if last else a
    if b < a:
        raise ConfigError(
            f"profiler.steps={spec!r}: the last step is before the first", "write it as FIRST-LAST, e.g. 3-4"
        )
    return a, b


def _int(text: str, spec: str, key: str = "profiler.ranks") -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(
            f"{key}={spec!r}: {text!r} is not a number",
            "use e.g. --profiler.ranks=0,last or every:4 or all; --profiler.steps=3-4",
        ) from None


def _positive_int(text: str, spec: str, key: str = "profiler.ranks") -> int:
    n = _int(text, spec, key)
    if n < 1:
        raise ConfigError(
            f"{key}={spec!r}: {n} must be at least 1", "steps are 1-based; every:K needs K >= 1"
        )
    return n


class StepProfiler:
    """Records steps `steps` on this rank if `ranks` chooses it: call begin(n) before step n runs and
    end(n) after it (n 1-based), close() at the end of training (stops a recording still running)."""

    def __init__(
        self,
        ranks: str,
        steps: str,
        rank: int,
        world_size: int,
        run_dir: str | Path,
        device_type: str = "cpu",
        memory_snapshot: bool = False,
    ):
        self.enabled = rank in parse_ranks(ranks, world_size)
        self.first, self.last = parse_steps(steps)
        self.rank, self.device_type = rank, device_type
        self.memory = memory_snapshot and device_type == "cuda"
        self.dir = Path(run_dir) / "profile"
        self._prof = None

    def begin(self, step: int) -> None:
        """Start recording if `step` is the first profiled step (on a chosen rank)."""
        if not self.enabled or step != self.first:
            return
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device_type == "cuda" else [])
        if self.memory:
            torch.cuda.memory._record_memory_history(max_entries=100_000)
        self._prof = profile(activities=activities, record_shapes=True, with_stack=False)
        self._prof.__enter__()

    def end(self, step: int) -> Path | None:
        """Stop and write the trace after the last profiled step; returns its path (else None)."""
        if self._prof is None or step < self.last:
            return None
        return self._stop()

    def close(self) -> Path | None:
        """Write what was recorded if training ended inside the profiled steps."""
        return self._stop() if self._prof is not None else None

    def trace_path(self) -> Path:
        """Rank-unique trace file name (rank, host, steps)."""
        return (
            self.dir / f"trace-rank{self.rank:05d}-{socket.gethostname()}-steps{self.first}-{self.last}.json"
        )

    def _stop(self) -> Path:
        import torch

        self._prof.__exit__(None, None, None)
        path = self.trace_path()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._prof.export_chrome_trace(str(path))
        self._prof = None
        if self.memory:
            torch.cuda.memory._dump_snapshot(str(path.with_suffix(".memory.pickle")))
            torch.cuda.memory._record_memory_history(enabled=None)
        return path
