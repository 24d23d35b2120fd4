"""Wall time and CPU time of the same interval, for single-process benchmarks on shared machines.

The wall-clock median is what a user sees, but on a machine shared with other work it mostly measures
the neighbours. The process's CPU time (all its threads: the training thread, the TensorBoard writer,
the sampler, torch's intra-op workers) counts only work this process did, so the CPU-time ratio of two
sides running the same work stays meaningful under load. Both are reported; neither replaces the other.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """Seconds of wall time and of this process's CPU time."""

    wall: float
    cpu: float

    def __sub__(self, other: "Span") -> "Span":
        return Span(self.wall - other.wall, self.cpu - other.cpu)

    def __truediv__(self, n: float) -> "Span":
        return Span(self.wall / n, self.cpu / n)


def now() -> Span:
    """The two clocks read together."""
    return Span(time.perf_counter(), time.process_time())


def report(times: dict[str, list[Span]], a: str, b: str, goal: str) -> str:
    """Per-side median step lines (wall and CPU) and the two ratios a/b."""
    lines = []
    med = {}
    for clock in ("wall", "cpu"):
        for k, spans in times.items():
            values = [getattr(s, clock) * 1000 for s in spans]
            med[k, clock] = statistics.median(values)
            lines.append(
                f"  {k:9s} median step {clock:4s} {med[k, clock]:8.2f} ms  "
                f"(all: {', '.join(f'{v:.1f}' for v in values)})"
            )
    for clock in ("wall", "cpu"):
        lines.append(f"ratio {a}/{b} by {clock:4s} time = {med[a, clock] / med[b, clock]:.3f}  ({goal})")
    lines += [_paired(times[a], times[b], clock, f"{a}/{b}") for clock in ("wall", "cpu")]
    return "\n".join(lines)


def _paired(a: list[Span], b: list[Span], clock: str, name: str) -> str:
    """The median of the ratios of neighbouring blocks (repetition i of each side), with its quartiles.

    Interleaved blocks of one repetition run seconds apart, so a slow drift of the machine (another
    job starting, the clock frequency) divides out of each ratio; the median of the ratios is then
    steadier than the ratio of the two medians when the blocks' own spread is large.
    """
    ratios = sorted(getattr(x, clock) / getattr(y, clock) for x, y in zip(a, b))
    if len(ratios) < 4:
        return f"paired ratio {name} by {clock:4s} time = {statistics.median(ratios):.3f}"
    q1, q2, q3 = statistics.quantiles(ratios, n=4)
    spread = f"quartiles {q1:.3f}-{q3:.3f}, {len(ratios)} pairs"
    return f"paired ratio {name} by {clock:4s} time = {q2:.3f}  ({spread})"
