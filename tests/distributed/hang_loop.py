"""A user's own loop on the public API for tests/distributed/test_hangs.py: 4 ranks, an all_reduce per step,
`exatrain.step()` as the progress mark; rank STALL_RANK stalls at step STALL_STEP as argv[1] says:
sleep (forever in the loop), sigstop (stops its own process), collective (waits in a recv nobody sends),
none (no stall). argv[2]: steps (default 30), argv[3]: seconds of work per step (default 0.05)."""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import exatrain

STALL_RANK, STALL_STEP = 2, 7


def stall(how: str) -> None:
    """The stall itself: each kind is on its own line, which the diagnosis must name."""
    if how == "sleep":
        time.sleep(3600)  # STALL-LINE sleep
    if how == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)  # STALL-LINE sigstop
    if how == "collective":
        dist.recv(torch.zeros(1), src=(STALL_RANK + 1) % dist.get_world_size())  # STALL-LINE collective


def main() -> None:
    how, steps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30
    work_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.05
    with exatrain.init(quiet=True) as ctx:
        total = torch.zeros(1)
        for n in range(1, steps + 1):
            exatrain.step()
            if n == STALL_STEP and ctx.rank == STALL_RANK:
                stall(how)
            time.sleep(work_s)  # the step's work
            t = torch.ones(1)
            dist.all_reduce(t)
            total += t
        exatrain.print0(f"finished {steps} steps, total {total.item():g}")


if __name__ == "__main__":
    main()
