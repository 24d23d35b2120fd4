"""Save throughput of a sharded checkpoint vs sequential write speed of the same disk, measured together.

Two ranks (gloo, CPU) train the `medium` model through the exatrain trainer (DDP, AdamW state populated);
the checkpoint manager saves the whole training state with DCP (each rank writes its share of the
deduplicated tensors, files fsync'ed, then the atomic commit). The baseline is `dd if=/dev/zero bs=1M
conv=fdatasync` of the same byte count into the same directory, by rank 0 alone, interleaved with the saves
(dd, save, dd, save, ...). Result: median save throughput / median dd throughput. Goal: >= 0.8.

The manager deletes the checkpoint that falls out of retention (`keep`) on a background thread after the
commit; the benchmark waits for that deletion after each save, outside the timed save and before the next
dd (so that it never overlaps a dd), and prints how long that wait took.

    cd REPO && .venv/bin/python -m benchmarks.checkpoint_throughput [--dir /scratch/x] [--reps 5]
"""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path

from benchmarks._checkpoint_setup import arguments, build_trainer, describe, median_ms, relaunch_or_run, shared_scratch
from exatrain.distributed import all_gather_objects, barrier, is_root


def dd_seconds(target: Path, mib: int) -> float:
    """Wall time of writing `mib` MiB of zeros sequentially with an fdatasync at the end."""
    t0 = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={mib}", "conv=fdatasync"],
                   check=True, capture_output=True)
    seconds = time.perf_counter() - t0
    target.unlink()
    return seconds


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def worker(ctx, a) -> None:
    with shared_scratch(a.dir) as tmp:
        trainer = build_trainer(ctx, tmp / "run", a.size, a.seq_len, a.micro_batch, async_save=False)
        manager = trainer.checkpoints
        first = manager.save(trainer.step, trainer.state)  # warm-up (first-use costs), also gives the size
        size = folder_bytes(first) if is_root() else 0
        mib = max(1, round(all_gather_objects(size)[0] / 2**20))
        saves, dds, prunes = [], [], []
        for rep in range(a.reps):
            if is_root():
                dds.append(dd_seconds(tmp / "dd.bin", mib))
            barrier()
            trainer.step += 1
            t0 = time.perf_counter()
            manager.save(trainer.step, trainer.state)  # ends with the commit and a barrier
            saves.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            manager.finish_pruning()  # rank 0: the background deletion of the step that fell out of `keep`
            prunes.append(time.perf_counter() - t0)
        header = describe(trainer, ctx, a)
        if is_root():
            save_rate = mib / statistics.median(saves)
            dd_rate = mib / statistics.median(dds)
            print(f"{header}, checkpoint {mib} MiB on disk")
            print(f"  DCP save (whole state, commit incl.) {median_ms(saves)}  -> {save_rate:7.1f} MiB/s")
            print(f"  dd bs=1M conv=fdatasync              {median_ms(dds)}  -> {dd_rate:7.1f} MiB/s")
            print(f"  (then waited for the pruning thread  {median_ms(prunes)}, not part of the save)")
            print(f"ratio save/dd = {save_rate / dd_rate:.3f}  (goal >= 0.8)")


def main() -> int:
    a = arguments(__doc__.splitlines()[0]).parse_args()
    return relaunch_or_run("benchmarks.checkpoint_throughput", a, lambda ctx: worker(ctx, a))


if __name__ == "__main__":
    raise SystemExit(main())
