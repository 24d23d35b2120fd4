"""A torchrun worker that checkpoints on SIGUSR2, for the agent tests (torch-free, starts in milliseconds).

``python usr2_worker.py DIR``: writes DIR/ready-R (its pid) once its handler is set, DIR/got-R when SIGUSR2
arrives, then "checkpoints" (DIR/checkpoint-delay seconds, default 1) and writes DIR/done-R and exits 0.
Rank 0 also leaves DIR/requeue-requested, as exatrain's trainer does after a committed checkpoint. A
restarted job (SLURM_RESTART_COUNT > 0) says "resumed" and exits 0 at once.
"""

import os
import signal
import sys
import time
from pathlib import Path

out = Path(sys.argv[1])
rank = os.environ["RANK"]
if int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0:
    print(f"worker {rank}: resumed", flush=True)
    sys.exit(0)
got = []


def on_usr2(signum, frame):
    got.append(signum)
    (out / f"got-{rank}").write_text(f"{os.getpid()}\n")


signal.signal(signal.SIGUSR2, on_usr2)
(out / f"ready-{rank}").write_text(f"{os.getpid()}\n")
while not got:
    time.sleep(0.05)
time.sleep(float(os.environ.get("CHECKPOINT_DELAY", "1")))
(out / f"done-{rank}").write_text("checkpointed after SIGUSR2\n")
if rank == "0":
    (out / "requeue-requested").write_text("checkpoint committed\n")
print(f"worker {rank}: got SIGUSR2, checkpointed, exiting", flush=True)
