"""Training stall of an async checkpoint save vs a sync save of the same state.

Two ranks (gloo, CPU) train the `medium` model through the exatrain trainer (DDP, AdamW). Each repetition
runs a few normal steps (their median is the baseline step time), then the step that triggers a save,
timed like the trainer's loop runs it (step + save call), once with a sync save and once with an async one
(order alternating between repetitions). The training thread loses (a) the time blocked in the save call
(the stall, timed directly) and (b) the extra time of the next step, whose optimizer step waits until the
background copy of the state is complete (its time over the median of normal steps). Headline result:
median async loss (a + b) / median sync loss (a + b). Goal: <= 0.1. Printed beside it: the stall alone
(a; the headline until 2026-11, which left out b) and the total extra time of all steps until the background
save is committed (on machines with few cores the copy and writer threads compete with training for the CPU).

    cd REPO && .venv/bin/python -m benchmarks.checkpoint_stall [--dir /scratch/x] [--reps 5]
"""

from __future__ import annotations

import statistics
import time

from benchmarks._checkpoint_setup import (
    arguments,
    build_trainer,
    describe,
    median_ms,
    relaunch_or_run,
    shared_scratch,
    step,
)
from exatrain.distributed import is_root

MAX_FOLLOW_STEPS = 50  # steps to wait for a background save before blocking on it


def save_step(trainer, blocking: bool) -> float:
    """The step that triggers a save, as the training loop runs it; returns the time of the save call, which
    is what that step takes beyond a normal one."""
    step(trainer)
    t0 = time.perf_counter()
    trainer.checkpoints.save(trainer.step, trainer.state, blocking=blocking)
    return time.perf_counter() - t0


def collect_seconds(trainer) -> float:
    """Time to collect the state dict alone (get_state_dict and friends), part of every save's blocking
    time."""
    t0 = time.perf_counter()
    trainer.state.state_dict()
    return time.perf_counter() - t0


def until_committed(trainer) -> list[float]:
    """Step on until the background save (if any) is committed; the steps' wall times (a final forced wait
    counts as one more step's worth of time)."""
    times = []
    while trainer.checkpoints.pending is not None and len(times) < MAX_FOLLOW_STEPS:
        times.append(step(trainer))
    if trainer.checkpoints.pending is not None:
        t0 = time.perf_counter()
        trainer.checkpoints.wait()
        times.append(time.perf_counter() - t0)
    return times


def worker(ctx, a) -> None:
    with shared_scratch(a.dir) as tmp:
        trainer = build_trainer(ctx, tmp / "run", a.size, a.seq_len, a.micro_batch, async_save=True)
        for blocking in (True, False):  # warm-up of both paths (first-use costs, the async writer thread)
            save_step(trainer, blocking)
            until_committed(trainer)
        stalls, extras, baselines, collect = {"sync": [], "async": []}, {"sync": [], "async": []}, [], []
        two = {
            "sync": [],
            "async": [],
        }  # the save step and the next one, whose optimizer step may wait for the copy
        for rep in range(a.reps):
            for mode in ("sync", "async") if rep % 2 == 0 else ("async", "sync"):
                base = statistics.median(step(trainer) for _ in range(a.baseline_steps))
                baselines.append(base)
                collect.append(collect_seconds(trainer))
                stall = save_step(trainer, blocking=mode == "sync")
                follow = until_committed(trainer)
                stalls[mode].append(stall)
                two[mode].append(stall + (follow[0] - base if follow else 0.0))
                extras[mode].append(stall + sum(follow) - base * len(follow))
        header = describe(trainer, ctx, a)
        if is_root():
            ratio = statistics.median(two["async"]) / statistics.median(two["sync"])
            stall_ratio = statistics.median(stalls["async"]) / statistics.median(stalls["sync"])
            print(f"{header}, seq {a.seq_len} x micro batch {a.micro_batch}")
            print(f"  baseline step                  {median_ms(baselines)}")
            print(f"  collecting the state dict      {median_ms(collect)}")
            for mode in ("sync", "async"):
                print(f"  {mode:5s} stall of the save step   {median_ms(stalls[mode])}")
            for mode in ("sync", "async"):
                print(f"  {mode:5s} stall incl. the next step {median_ms(two[mode])}")
            for mode in ("sync", "async"):
                print(f"  {mode:5s} total extra until commit {median_ms(extras[mode])}")
            print(
                f"ratio async/sync training-thread loss (stall + next step) = {ratio:.3f}  (goal <= 0.1); "
                f"stall alone = {stall_ratio:.3f}; total extra until commit = "
                f"{statistics.median(extras['async']) / statistics.median(extras['sync']):.3f}"
            )


def main() -> int:
    p = arguments(__doc__.splitlines()[0])
    p.add_argument("--baseline-steps", type=int, default=3)
    a = p.parse_args()
    return relaunch_or_run("benchmarks.checkpoint_stall", a, lambda ctx: worker(ctx, a))


if __name__ == "__main__":
    raise SystemExit(main())
