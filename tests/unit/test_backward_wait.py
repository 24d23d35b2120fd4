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
