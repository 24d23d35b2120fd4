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
    """Step, phase and the monotonic time of the last mark, and the rank's GPU; read by the watcher
    thread."""

    __slots__ = ("step", "batches", "phase", "since", "marks", "step_times", "device")

    def __init__(self) -> None:
        self.step, self.batches, self.phase, self.since, self.marks = 0, 0, "start", time.monotonic(), 0
        self.step_times: list[
            float
        ] = []  # monotonic time of the first few step marks (the measured step time)
        # "GPU 3" once exatrain.init picked one (set_device): the watcher thread cannot ask CUDA itself,
        # whose current device is per thread
        self.device: str | None = None


#: the process's record (see the module docstring for why there is one)
PROGRESS = Progress()
#: a hook run on the first mark: starts the watcher when `exatrain run --hang-timeout` asked for one
_first_mark_hooks: list = []
_KEEP_STEP_TIMES = 11  # the first step (warm-up) and 9 more: enough for a median


def mark(phase: str) -> None:
    """Record that this rank is alive and in `phase` now (the DataLoader, Checkpointer and trainer call
    it)."""
    p = PROGRESS
    p.phase, p.since = phase, time.monotonic()
    p.marks += 1
    if _first_mark_hooks:
        _run_hooks()


def set_device(label: str | None) -> None:
    """Record the rank's device for hang reports ("GPU 3", the node's number; None on the CPU)."""
    PROGRESS.device = label


def batch() -> None:
    """A batch arrived from `exatrain.DataLoader`: progress (the user's step runs until the next mark)."""
    p = PROGRESS
    p.batches += 1
    mark("compute")
    if p.step == 0:  # a loop without exatrain.step(): its batches are its steps
        _time_step(p)


def step(n: int | None = None) -> int:
    """Mark the start of a training step (`exatrain.step()`): the step count goes up by one (or is set to
    `n`) and the rank counts as making progress. Costs an attribute update; nothing is synchronised."""
    p = PROGRESS
    p.step = p.step + 1 if n is None else int(n)
    mark("step")
    _time_step(p)
    return p.step


def _time_step(p: Progress) -> None:
    if len(p.step_times) < _KEEP_STEP_TIMES:
        p.step_times.append(p.since)


#: the floor of the derived ("auto") hang timeout: shorter stalls (a slow checkpoint, a file system hiccup)
#: are too common at scale to stop a job for (issue 25: max(10 x the median step, 5 min))
AUTO_FLOOR_S = 300.0
AUTO_STEPS = 10  # the derived timeout is that many median steps


def derived_timeout_s(floor_s: float = AUTO_FLOOR_S) -> float | None:
    """The hang timeout when the user set none: max(AUTO_STEPS x the median step after the first, `floor_s`,
    the first step), from the first few step marks (the median term once a step after the first is done);
    None before two marks (the first step's length, its warm-up, is not known yet: nothing is declared hung
    during it)."""
    times = PROGRESS.step_times
    if len(times) < 2:
        return None
    warmup = times[1] - times[0]
    gaps = sorted(b - a for a, b in zip(times[1:], times[2:]))
    median = gaps[(len(gaps) - 1) // 2] if gaps else 0.0
    return max(AUTO_STEPS * median, floor_s, warmup)


def steps_timed() -> bool:
    """Whether the record of the first steps is complete (the derived timeout no longer changes)."""
    return len(PROGRESS.step_times) >= _KEEP_STEP_TIMES


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
    """Under `exatrain run --hang-timeout` (its variables, read in env/), start the watcher at the first
    mark."""
    from exatrain.env.watch import hang_request

    req = hang_request()
    if req is not None and req.watch:
        on_first_mark(_arm)


def _arm() -> None:
    from exatrain.observe.hang import arm_from_environment

    arm_from_environment()


_arm_when_asked()
