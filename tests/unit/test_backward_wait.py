"""`observe.backward_wait` (docs/hangs.md, "Stragglers"): the tail wait of a backward pass is the time from
the end of its gradient computation to the return of `backward()`. Here a final callback that sleeps,
queued by a parameter's gradient hook as DDP's reducer queues `finalize_backward` once its last bucket is
ready, stands in for DDP's wait for the other ranks (tests/distributed/test_stragglers.py has real DDP)."""

import time

import torch

from exatrain.observe import backward_wait

WAIT_S = 0.2


def _loss_with_a_waiting_finalizer(compute_s: float = 0.0) -> torch.Tensor:
    w = torch.ones(3, requires_grad=True)
    queued = []

    def like_ddp(grad):  # DDP queues its finalize_backward from a gradient hook, once per backward
        if not queued:
            queued.append(True)
            torch.autograd.Variable._execution_engine.queue_callback(lambda: time.sleep(WAIT_S))
        time.sleep(compute_s)  # gradient work done before the end of compute
        return grad

    w.register_hook(like_ddp)
    return (w * 2).sum()


def test_the_wait_after_the_last_gradient_is_measured_and_compute_is_not():
    backward_wait.take()
    loss = _loss_with_a_waiting_finalizer(compute_s=0.3)
    start = time.perf_counter()
    backward_wait.backward(loss)
    total = time.perf_counter() - start
    seconds, count = backward_wait.take()
    assert count == 1
    assert WAIT_S <= seconds < total - 0.25, (seconds, total)  # the sleep after compute, not the 0.3 s in it
    assert backward_wait.take() == (0.0, 0)  # take() starts again


def test_a_backward_without_a_waiting_finalizer_waits_next_to_nothing():
    backward_wait.take()
    loss = (torch.ones(3, requires_grad=True) * 2).sum()
    with backward_wait.timed(loss):
        loss.backward()
    seconds, count = backward_wait.take()
    assert count == 1 and seconds < WAIT_S / 2, seconds


def test_a_loss_without_gradient_is_not_timed_and_waiting_counts_a_host_wait():
    backward_wait.take()
    with backward_wait.timed(torch.ones(())):
        pass
    assert backward_wait.take() == (0.0, 0)
    with backward_wait.waiting():
        time.sleep(0.05)
    seconds, count = backward_wait.take()
    assert count == 1 and seconds >= 0.05


class _Clock:
    """A perf_counter that moves 1 s per reading: the seconds measured count the readings taken."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 1.0
        return self.now


def test_a_collective_wait_counts_its_block_but_not_inside_a_backwards_tail(monkeypatch):
    """collective_wait (FSDP's gathers and reduce-scatters, distributed/collective_waits.py) adds its
    block's host time without counting a backward; inside a timed backward's tail (FSDP's final callback
    runs there) it adds nothing, since the tail already counts that time: with a clock that moves 1 s per
    reading, the tail is 1 s (its two marks), not 3 s (the wait's two readings in between, counted
    twice)."""
    backward_wait.take()
    monkeypatch.setattr(backward_wait.time, "perf_counter", _Clock())
    with backward_wait.collective_wait(cuda=False):
        pass
    assert backward_wait.take() == (1.0, 0)

    w = torch.ones(3, requires_grad=True)
    seen = []

    def like_fsdp_final_callback():
        seen.append(backward_wait._WAITS.in_tail)
        with backward_wait.collective_wait(cuda=False):
            pass

    def queue(grad):
        torch.autograd.Variable._execution_engine.queue_callback(like_fsdp_final_callback)
        return grad

    w.register_hook(queue)
    backward_wait.backward((w * 2).sum())
    assert seen == [True] and backward_wait.take() == (1.0, 1)
    assert not backward_wait._WAITS.in_tail  # the tail ends with backward()


def test_fsdp2_and_functional_collective_waits_are_wrapped_once():
    """Pins the private torch functions distributed/collective_waits.py wraps: FSDP2's FSDPParamGroup
    methods and the functional collectives' wait_tensor, which DTensor's redistributions (tensor
    parallelism) wait in."""
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    from exatrain.distributed.collective_waits import WAITING_METHODS, time_fsdp_waits, time_tp_waits

    assert time_fsdp_waits() and time_fsdp_waits() and time_tp_waits() and time_tp_waits()
    methods = [getattr(FSDPParamGroup, name) for name in WAITING_METHODS] + [funcol.wait_tensor]
    for method in methods:
        assert method._exatrain_timed and not getattr(method.__wrapped__, "_exatrain_timed", False), method
