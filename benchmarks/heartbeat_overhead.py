"""Cost of hang watching in the trainer's step: the progress marks (`exatrain.step()` and the phase marks
the trainer's StepMetrics phases make) plus the running watcher thread (heartbeat file every 5 s) ON, vs
the same step with neither OFF.

One process, one Trainer (the tiny reference model by default, where a fixed per-step cost weighs most);
both sides run the trainer's own step pieces. Repetitions are interleaved (A B, B A, ...) so machine noise
hits both alike; the result is the ratio of median step times (on / off), by wall time and by the process's
CPU time, which counts the watcher thread too (benchmarks/clock.py). Goal (issue 25): <= 1.01. The last
two lines time the marks and `exatrain.backward`'s wait timing alone.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.heartbeat_overhead [--size tiny] [--steps 20] [--reps 7]
"""

from __future__ import annotations

import tempfile

import torch

from benchmarks._cpu_trainer import QUIET_OBSERVE, alternating, arguments, cpu_config, describe
from benchmarks.clock import report
from benchmarks.observe_overhead import off_side, timed
from exatrain.distributed import init_distributed
from exatrain.env import detect_environment
from exatrain.observe import heartbeat
from exatrain.observe.hang import start_watcher, stop_watcher
from exatrain.train.data_setup import prepare_data
from exatrain.train.trainer import Trainer


def on_side(trainer):
    """The bare step with the marks Trainer.fit makes: the step marker and one mark per phase."""

    def step():
        heartbeat.step()
        heartbeat.mark("data")
        batches = trainer._micro_batches()
        heartbeat.mark("forward_backward")
        trainer.engine.train_step(batches)
        heartbeat.mark("optimizer")
        trainer._optimizer_step()
        heartbeat.mark("checkpoint")

    return step


def main():
    a = arguments(__doc__.splitlines()[0], size="tiny").parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = cpu_config(a, tmp, QUIET_OBSERVE)
        ctx = init_distributed(detect_environment({}), "cpu")
        trainer = Trainer(cfg, ctx, prepare_data(cfg))
        sides = {"on": on_side(trainer), "off": off_side(trainer)}
        for step in sides.values():
            timed(step, 3)  # warm-up
        times = {k: [] for k in sides}
        for _, name in alternating(list(sides), a.reps):
            if name == "on":  # the watcher runs only while the ON side does
                start_watcher(f"{tmp}/run", 0, 1, 3600, host="bench")
            times[name].append(timed(sides[name], a.steps))
            stop_watcher()
        print(describe(a))
        print(report(times, "on", "off", "goal <= 1.01"))
        print(_mark_cost(times["off"]))
        print(_backward_wait_cost(times["off"]))
        print(_collective_wait_cost())


def _collective_wait_cost() -> str:
    """What timing FSDP's collectives adds (distributed/collective_waits.py): one `collective_wait` block
    on the host clock (CPU ranks), best of 5 in a tight loop; FSDP runs three per sharded module per step."""
    import timeit

    from exatrain.observe import backward_wait

    def block():
        with backward_wait.collective_wait(False):
            pass

    n = 200_000
    per_call = min(timeit.repeat(block, number=n, repeat=5)) / n
    backward_wait.take()
    return (
        f"FSDP's collective waits timed: {per_call * 1e6:.2f} us per wrapped call; "
        f"xl (18 blocks + the root) makes 57 per step: {57 * per_call * 1e6:.0f} us per step"
    )


def _mark_cost(off_times) -> str:
    """The marks alone, timed in a tight loop: a noise-free upper bound of their share of a step."""
    import statistics
    import timeit

    def marks():
        heartbeat.step()
        for phase in ("data", "forward_backward", "optimizer", "checkpoint"):
            heartbeat.mark(phase)

    n = 200_000
    per_step = min(timeit.repeat(marks, number=n, repeat=5)) / n
    off = statistics.median(t.wall for t in off_times)
    return (
        f"the 5 marks of one step: {per_step * 1e6:.2f} us = {per_step / off:.2e} of the median OFF step "
        f"({off * 1e3:.1f} ms)"
    )


def _backward_wait_cost(off_times) -> str:
    """What `exatrain.backward` adds to a backward pass (a hook on the loss, an engine callback, two clock
    reads; on both sides above, since the trainer's engines always use it): a tiny backward with and without
    it, best of 5 in a tight loop."""
    import statistics
    import timeit

    from exatrain.observe import backward_wait

    w = torch.ones(3, requires_grad=True)

    def plain():
        (w * 2).sum().backward()

    def timed_backward():
        backward_wait.backward((w * 2).sum())

    n = 20_000
    cost = [min(timeit.repeat(f, number=n, repeat=5)) / n for f in (timed_backward, plain)]
    backward_wait.take()
    off = statistics.median(t.wall for t in off_times)
    extra = cost[0] - cost[1]
    return (
        f"exatrain.backward's wait timing: {extra * 1e6:.2f} us per backward (tiny backward "
        f"{cost[1] * 1e6:.2f} -> {cost[0] * 1e6:.2f} us) = {extra / off:.2e} of the median OFF step"
    )


if __name__ == "__main__":
    main()
