"""A user's own loop with checkpoints for tests/distributed/test_hangs.py's restart test: every step adds
the all_reduce of the step number to a running total kept in the checkpoint (every 5 steps); rank 1 sleeps
at step 7 of the first attempt only. argv: RUN_DIR STEPS [HANG_TIMEOUT_S] (with a timeout the script starts
its own watcher, exatrain.watch_hangs: how a SLURM job's script does it without `exatrain run`). The last line
says which steps this attempt ran and the total, which equals WORLD x (1 + ... + STEPS) only when a resumed
run lost no checkpointed state."""

import sys
import time

import torch
import torch.distributed as dist

import exatrain


def main() -> None:
    run_dir, steps = sys.argv[1], int(sys.argv[2])
    with exatrain.init(quiet=True) as ctx:
        if len(sys.argv) > 3:
            exatrain.watch_hangs(ctx, run_dir, float(sys.argv[3]))
        seen = {"total": 0.0}
        ckpt = exatrain.Checkpointer(
            run_dir, ctx, model=torch.nn.Linear(1, 1), extra=seen, interval=5, signals=""
        )
        start = ckpt.resume("auto")
        for n in range(start + 1, steps + 1):
            exatrain.step(n)
            if n == 7 and ctx.rank == 1 and ctx.env.restart_count == 0:
                time.sleep(3600)  # STALL-LINE restart
            t = torch.full((1,), float(n))
            dist.all_reduce(t)
            seen["total"] += t.item()
            ckpt.step(n)
        ckpt.close()
        exatrain.print0(
            f"attempt {ctx.env.restart_count} ran steps {start + 1}-{steps}, total {seen['total']:g}"
        )


if __name__ == "__main__":
    main()
