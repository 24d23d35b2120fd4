"""A user's own loop on one GPU for tests/gpu/test_gpu_hangs.py, under `exatrain run --nproc 1
--hang-timeout N`: an NCCL group of one rank, an all_reduce and a read of the result per step, and at step
STALL_STEP a GPU kernel that spins for SPIN_S seconds before that step's all_reduce, a stand-in for a GPU
that stops making progress (a hung kernel, a dead link): the host then waits in the read (STALL-LINE) while
NCCL's all_reduce sits queued behind the kernel. argv[1]: the GPU's clock cycles per second (measured by
the test), argv[2]: steps.

The group of one is the script's own (`exatrain.init` makes none for a single rank); the flight recorder's
variables are set first with exatrain's own values, as `exatrain.init` sets them for NCCL groups.
"""

import os
import sys

import torch
import torch.distributed as dist

import exatrain
from exatrain.distributed.variables import flight_recorder_variables, set_variables

STALL_STEP, SPIN_S = 5, 120


def main() -> None:
    cycles_per_s, steps = float(sys.argv[1]), int(sys.argv[2])
    with exatrain.init(quiet=True) as ctx:
        assert ctx.device.type == "cuda", ctx.device
        set_variables(flight_recorder_variables(os.environ, "nccl"))
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=ctx.device)
        total = torch.zeros(1, device=ctx.device)
        for n in range(1, steps + 1):
            exatrain.step()
            if n == STALL_STEP:
                torch.cuda._sleep(int(SPIN_S * cycles_per_s))  # the GPU stops making progress
            t = torch.ones(1, device=ctx.device)
            dist.all_reduce(t)
            total += t
            seen = total.item()  # STALL-LINE the host waits for the GPU here
        dist.destroy_process_group()
        exatrain.print0(f"finished {steps} steps, total {seen:g}")


if __name__ == "__main__":
    main()
