"""Save throughput of a sharded checkpoint vs parallel write speed of the same disk, measured together.

Two ranks (gloo, CPU) train the `medium` model through the exatrain trainer (DDP, AdamW state populated);
the checkpoint manager saves the whole training state with DCP (each rank writes its share of the
deduplicated tensors with 2 writer threads, files fsync'ed, then the atomic commit). The baseline writes the
same byte count with the same parallelism and incompressible data: `fio` with 4 jobs (2 ranks x 2 threads)
of sequential 1 MiB buffered writes of random data (fio's default buffers, scrambled per write; not refilled:
regenerating random data on every write is CPU work the save does not do), each job its own file, fsync at
the end, started by rank 0 while the other rank waits; wall time from start to exit, like the save's, less
the wall time of the same fio command writing 1 MiB per job (fio's start-up, ~2 s here).
Interleaved with the saves (fio, dd, save, fio, dd, save, ...). Result: median save throughput / median fio
throughput. Goal: >= 0.8. Printed beside it, for the history: the old baseline, one `dd if=/dev/zero bs=1M
conv=fdatasync` stream of zeros (until 2026-11 the headline divided by it: one stream of zeros is not what
2 x 2 writers of tensor data do).

The manager deletes the checkpoint that falls out of retention (`keep`) on a background thread after the
commit; the benchmark waits for that deletion after each save, outside the timed save and before the next
baseline (so that it never overlaps one), and prints how long that wait took.

Needs fio (Debian: `apt-get install fio`; not installed by scripts/install.sh, CI does not run benchmarks).

    cd REPO && .venv/bin/python -m benchmarks.checkpoint_throughput [--dir /scratch/x] [--reps 5]
"""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path

from benchmarks._checkpoint_setup import (
    arguments,
    build_trainer,
    describe,
    median_ms,
    relaunch_or_run,
    shared_scratch,
)
from exatrain.distributed import all_gather_objects, barrier, is_root


def dd_seconds(target: Path, mib: int) -> float:
    """Wall time of writing `mib` MiB of zeros sequentially with an fdatasync at the end."""
    t0 = time.perf_counter()
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={mib}", "conv=fdatasync"],
        check=True,
        capture_output=True,
    )
    seconds = time.perf_counter() - t0
    target.unlink()
    return seconds


FIO_JOBS = 4  # 2 ranks x 2 writer threads per rank, as the save


def _fio_wall(folder: Path, each_mib: int) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [
            "fio",
            "--name=baseline",
            f"--directory={folder}",
            "--rw=write",
            "--bs=1M",
            f"--size={each_mib}M",
            f"--numjobs={FIO_JOBS}",
            "--ioengine=psync",
            "--end_fsync=1",
            "--buffer_compress_percentage=0",
            "--group_reporting",
            "--output-format=terse",
        ],
        check=True,
        capture_output=True,
    )
    seconds = time.perf_counter() - t0
    for f in folder.glob("baseline.*"):
        f.unlink()
    return seconds


def fio_seconds(folder: Path, mib: int) -> float:
    """Wall time of FIO_JOBS parallel sequential writers of random data, `mib` MiB in all, fsync at the end,
    less fio's own start-up (a run of 1 MiB per job right after, subtracted: on this machine fio needs ~2 s to
    start, more than the writing; its self-reported runtime leaves out the final fsync)."""
    each = max(2, round(mib / FIO_JOBS))
    seconds = _fio_wall(folder, each) - _fio_wall(folder, 1)
    return seconds * mib / ((each - 1) * FIO_JOBS)  # scaled to exactly `mib` MiB


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def worker(ctx, a) -> None:
    with shared_scratch(a.dir) as tmp:
        trainer = build_trainer(ctx, tmp / "run", a.size, a.seq_len, a.micro_batch, async_save=False)
        manager = trainer.checkpoints
        first = manager.save(trainer.step, trainer.state)  # warm-up (first-use costs), also gives the size
        size = folder_bytes(first) if is_root() else 0
        mib = max(1, round(all_gather_objects(size)[0] / 2**20))
        saves, dds, fios, prunes = [], [], [], []
        if is_root():
            (tmp / "fio").mkdir()
        for _rep in range(a.reps):
            if is_root():
                fios.append(fio_seconds(tmp / "fio", mib))
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
            fio_rate = mib / statistics.median(fios)
            print(f"{header}, checkpoint {mib} MiB on disk")
            print(f"  DCP save (whole state, commit incl.) {median_ms(saves)}  -> {save_rate:7.1f} MiB/s")
            print(
                f"  fio {FIO_JOBS} jobs, random data, end_fsync  {median_ms(fios)}  -> {fio_rate:7.1f} MiB/s"
            )
            print(f"  dd bs=1M zeros conv=fdatasync        {median_ms(dds)}  -> {dd_rate:7.1f} MiB/s")
            print(f"  (then waited for the pruning thread  {median_ms(prunes)}, not part of the save)")
            print(
                f"ratio save/fio = {save_rate / fio_rate:.3f}  (goal >= 0.8); old baseline: save/dd = "
                f"{save_rate / dd_rate:.3f}"
            )


def main() -> int:
    a = arguments(__doc__.splitlines()[0]).parse_args()
    return relaunch_or_run("benchmarks.checkpoint_throughput", a, lambda ctx: worker(ctx, a))


if __name__ == "__main__":
    raise SystemExit(main())
