"""How long a backward pass waits for collectives after it has computed its last gradient (its tail wait).

Why: in a data-parallel step every rank waits for the slowest one inside backward's gradient reduction,
so every rank's forward/backward time is the slowest rank's. What differs is where the time goes: a rank
with a slow GPU (or slow CPU cores) computes until the end and hardly waits; the others finish computing
early and wait. The forward/backward time minus the tail wait is a rank's own compute time, which tells a
compute-side straggler apart (`StepMetrics`, docs/hangs.md "Stragglers").

How: a hook on the loss (the first node that backward runs) queues an autograd-engine callback. The engine
runs its callbacks in the order they were queued once the whole graph is done, and DDP queues its
`finalize_backward` (which waits for the gradient all-reduces) only when its last bucket is ready, so ours
runs first: when computing has ended and waiting has not begun. The wait ends when `backward()` returns.
On CPU both marks are host clocks. On CUDA/ROCm both are events on the current stream (the host sees only
kernel launches), read at the next log step like StepMetrics' own events (tests/gpu/test_gpu_hangs.py).

Waits outside backward's tail are added where a layer times them: FSDP's parameter gathers and gradient
reduce-scatters, and tensor parallelism's waits for its functional collectives (`distributed.
collective_waits` wraps them in `collective_wait`). Horovod waits for its all-reduces in
`optimizer.synchronize()`, after backward: `waiting()` times that block.

One accumulator per process, as `observe.heartbeat` keeps one: the engines' backward passes and the
`StepMetrics` that reads them do not share an object.
"""

from __future__ import annotations

import contextlib
import time

import torch


class _Waits:
    """Seconds of tail wait measured since the last `take()`, and CUDA event pairs not yet read."""

    __slots__ = ("seconds", "pending", "count", "in_tail")

    def __init__(self) -> None:
        self.seconds, self.pending, self.count = 0.0, [], 0
        self.in_tail = False  # between the end-of-compute mark and backward's return: the tail counts it all


_WAITS = _Waits()


@contextlib.contextmanager
def timed(loss: torch.Tensor):
    """Measure the tail wait of the backward pass of `loss` that runs inside the block (`loss.backward()`,
    or an engine's call that runs it, such as DeepSpeed's `backward(loss)`). A loss that needs no gradient
    is not timed."""
    if not (isinstance(loss, torch.Tensor) and loss.requires_grad):
        yield
        return
    cuda = loss.is_cuda
    computed: list = []  # the end-of-compute mark, set by the engine's callback

    def at_end_of_compute() -> None:
        _WAITS.in_tail = True
        if cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            computed.append(event)
        else:
            computed.append(time.perf_counter())

    def queue(grad):
        torch.autograd.Variable._execution_engine.queue_callback(at_end_of_compute)
        return grad

    handle = loss.register_hook(queue)
    try:
        yield
    finally:
        handle.remove()
        _WAITS.in_tail = False
        if computed:
            _record(computed[0], cuda)


@contextlib.contextmanager
def waiting():
    """Count the block as the tail wait of a backward pass: for an engine that waits for the gradient
    reduction on the host after `backward()` returns (Horovod's `optimizer.synchronize()`)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        _WAITS.seconds += time.perf_counter() - start
        _WAITS.count += 1


@contextlib.contextmanager
def collective_wait(cuda: bool):
    """Count the block as time this rank waited for a collective inside its forward or backward (FSDP's
    gathers and reduce-scatters): on CUDA/ROCm the current stream's stall between two events, else host
    time. Not counted inside a timed backward's tail, which already counts it."""
    if _WAITS.in_tail:
        yield
        return
    if not cuda:
        start = time.perf_counter()
        try:
            yield
        finally:
            _WAITS.seconds += time.perf_counter() - start
        return
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    try:
        yield
    finally:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        _keep(start, end)


#: CUDA event pairs kept unread at most; older ones (long done) are read then, so a loop that never
#: calls take() does not pile them up (FSDP adds three pairs per sharded block per step)
_MAX_PENDING = 16384


def _record(computed, cuda: bool) -> None:
    _WAITS.count += 1
    if not cuda:
        _WAITS.seconds += time.perf_counter() - computed
        return
    done = torch.cuda.Event(enable_timing=True)
    done.record()
    _keep(computed, done)


def _keep(start, end) -> None:
    _WAITS.pending.append((start, end))
    if len(_WAITS.pending) > _MAX_PENDING:
        old, _WAITS.pending = _WAITS.pending[: _MAX_PENDING // 2], _WAITS.pending[_MAX_PENDING // 2 :]
        _WAITS.seconds += _elapsed(old)


def _elapsed(pairs: list) -> float:
    pairs[-1][1].synchronize()  # the last event done means all are
    return sum(start.elapsed_time(end) for start, end in pairs) / 1000.0


def backward(loss: torch.Tensor) -> None:
    """`loss.backward()`, with its tail wait measured for `exatrain.StepMetrics` (`exatrain.backward`): in
    your own loop this lets the straggler accounting tell a rank with slow compute apart."""
    with timed(loss):
        loss.backward()


def take() -> tuple[float, int]:
    """(seconds of tail wait, backward passes timed) since the last call, and start again. Reads pending
    CUDA events, so call it where a sync is due anyway (StepMetrics: log steps only)."""
    seconds, count = _WAITS.seconds, _WAITS.count
    if _WAITS.pending:
        seconds += _elapsed(_WAITS.pending)
    _WAITS.seconds, _WAITS.pending, _WAITS.count = 0.0, [], 0
    return seconds, count
