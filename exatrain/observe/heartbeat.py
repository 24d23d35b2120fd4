"""This process's progress record: the step it is on, the phase it is in, and when it last moved.

The training thread only assigns three attributes of one object (no lock, no I/O, no host-device sync:
well under a microsecond, `benchmarks/heartbeat_overhead.py`); the hang watcher (`observe.hang`), a thread
of the same process, reads them. One record per process, as `faulthandler` keeps one: a rank is one
process, and progress marks come from places that do not share an object (the DataLoader, the
Checkpointer, `exatrain.step()`, the trainer's phases).

Phases: data, forward_backward, optimizer, checkpoint, collective, step (a bare `exatrain.step()`), eval.
"""

from __future__ import annotations

import time


class Progress:
    """Step, phase and the monotonic time of the last mark; read by the watcher thread."""

    __slots__ = ("step", "batches", "phase", "since", "marks", "step_times")

    def __init__(self) -> None:
        self.step, self.batches, self.phase, self.since, self.marks = 0, 0, "start", time.monotonic(), 0
        self.step_times: list[
            float
        ] = []  # monotonic time of the first few step marks (the measured step time)


#: the process's record (see the module docstring for why there is one)
PROGRESS = Progress()
#: a hook run on the first mark: starts the watcher when `exatrain run --hang-timeout` asked for one
_first_mark_hooks: list = []
_KEEP_STEP_TIMES = 6


def mark(phase: str) -> None:
    """Record that this rank is alive and in `phase` now (the DataLoader, Checkpointer and trainer call it)."""
    p = PROGRESS
    p.phase, p.since = phase, time.monotonic()
    p.marks += 1
    if _first_mark_hooks:
        _run_hooks()


def batch() -> None:
    """A batch arrived from `exatrain.DataLoader`: progress (the user's step runs until the next mark)."""
    PROGRESS.batches += 1
    mark("compute")


def step(n: int | None = None) -> int:
    """Mark the start of a training step (`exatrain.step()`): the step count goes up by one (or is set to
    `n`) and the rank counts as making progress. Costs an attribute update; nothing is synchronised."""
    p = PROGRESS
    p.step = p.step + 1 if n is None else int(n)
    mark("step")
    if len(p.step_times) < _KEEP_STEP_TIMES:
        p.step_times.append(p.since)
    return p.step


def measured_step_s() -> float | None:
    """The longest step after the first (which includes warm-up) among the first few, None before two."""
    times = PROGRESS.step_times
    gaps = [b - a for a, b in zip(times[1:], times[2:])]
    return max(gaps) if gaps else None


def on_first_mark(hook) -> None:
    """Run `hook()` once, at the next progress mark (how `exatrain run --hang-timeout` arms the watcher in
    scripts that never call exatrain.init())."""
    _first_mark_hooks.append(hook)


def _run_hooks() -> None:
    hooks = list(_first_mark_hooks)
    _first_mark_hooks.clear()
    for hook in hooks:
        hook()


def _arm_when_asked() -> None:
    """Under `exatrain run --hang-timeout` (its variables, read in env/), start the watcher at the first mark."""
    from exatrain.env.watch import hang_request

    if hang_request() is not None:
        on_first_mark(_arm)


def _arm() -> None:
    from exatrain.observe.hang import arm_from_environment

    arm_from_environment()


_arm_when_asked()
