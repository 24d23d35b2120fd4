"""An unmodified script (none of exatrain's API) for tests/distributed/test_stack_dump.py: gloo ranks, an
all_reduce per step; rank 1 sleeps at step 3 forever, after touching the file argv[2].
argv[1]: the collective timeout in seconds (init_process_group's timeout)."""

import datetime
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    timeout, marker = float(sys.argv[1]), Path(sys.argv[2])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    for step in range(1, 1000):
        if step == 3 and dist.get_rank() == 1:
            marker.touch()
            time.sleep(3600)  # STALL-LINE
        t = torch.ones(1)
        dist.all_reduce(t)  # WAIT-LINE
        time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
