"""How a rank's share of a checkpoint reaches the disk: DCP's FileSystemWriter, tuned for throughput.

The files stay in DCP's own format (a torch.save record per tensor, fsync'ed), so DCP's FileSystemReader,
`dcp_to_torch_save` and `exatrain checkpoint export` read them unchanged. Three things differ from the
default writer, each measured in benchmarks/RESULTS.md:

- torch.save's CRC-32 of each record is off while DCP writes. It cost as much CPU as the rest of the
  serialisation (147 MiB on one core: 156 vs 80 ms), and neither torch.load nor DCP's reader checks it.
- Two writer threads per rank, a file each, so that one thread's serialisation overlaps the other's I/O.
- Early write-back: every few MiB the file asks the kernel to start writing what was just copied into the
  page cache (`posix_fadvise(DONTNEED)`, the flush PostgreSQL's checkpointer does with its `*_flush_after`
  settings). Without it, nothing reaches the disk until the final fsync (a few hundred MiB stay below the
  kernel's dirty thresholds), so the disk idles while a rank serialises and the CPU idles while it flushes.
"""

from __future__ import annotations

import io
import os
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from exatrain.distributed import rank

WRITER_THREADS = 2
WRITEBACK_CHUNK = 8 << 20  # bytes between early write-back requests


class WritebackFile(io.BufferedWriter):
    """A buffered binary file that starts the write-back of every `chunk` bytes written to it."""

    def __init__(self, path: str | Path, chunk: int = WRITEBACK_CHUNK):
        super().__init__(io.FileIO(str(path), "wb"))
        self.chunk, self.flushed_to = chunk, 0

    def write(self, data) -> int:
        n = super().write(data)
        end = self.tell()
        if self.chunk and end - self.flushed_to >= self.chunk:
            self.flush()
            self._start_writeback(self.flushed_to, end - self.flushed_to)
            self.flushed_to = end
        return n

    def _start_writeback(self, offset: int, length: int) -> None:
        """Start writing the range to disk without waiting for it (pages under write-back stay cached), so
        that the final fsync has little left to wait for. Only a hint: where the platform or the file system
        lacks it, write-back is left to the fsync."""
        try:
            os.posix_fadvise(self.fileno(), offset, length, os.POSIX_FADV_DONTNEED)
        except (AttributeError, OSError):  # not Linux, or a file system that refuses the advice
            self.chunk = 0


class CheckpointFileSystem(FileSystem):
    """DCP's local file system, for one save: new files are `WritebackFile`s written with torch.save's CRC-32
    off, and a failed write is remembered (see CheckpointWriter.write_data).

    DCP calls `create_stream` in each of its writer threads, which is where the CRC switch must be set: it
    is thread-local (a user override of torch.utils.serialization.config), so the training thread and any
    other torch.save are unaffected.
    """

    def __init__(self):
        self.errors: list[BaseException] = []

    @contextmanager
    def create_stream(self, path, mode: str):
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        before = torch.serialization.get_crc32_options()
        torch.serialization.set_crc32_options(False)
        try:
            try:
                stream = WritebackFile(path)
            except OSError as e:
                stream = _Unopened(
                    e
                )  # a context manager must yield; its first use raises into the except below
            with stream:
                yield stream
        except Exception as e:  # kept for write_data to raise, instead of ending a writer thread (see there)
            self.errors.append(e)
        finally:
            torch.serialization.set_crc32_options(before)


class _Unopened:
    """Stands in for a file that could not be opened: any use raises the error of the open."""

    def __init__(self, error: OSError):
        self.error = error

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def __getattr__(self, name):
        raise self.error


class CheckpointWriter(FileSystemWriter):
    """DCP's FileSystemWriter (fsync'ed files) with 2 threads, early write-back and no CRC-32 per record,
    which fails when any of its threads failed."""

    def __init__(self, path: Path):
        super().__init__(str(path), thread_count=WRITER_THREADS)
        self.fs = CheckpointFileSystem()

    def write_data(self, plan, planner):
        """Write this rank's items; raise if any was not written.

        DCP's extra writer threads only print their exceptions (a traceback on stderr), and the save would
        then commit a checkpoint whose metadata lacks that thread's tensors (found only when loading it). So a
        failed file's error is kept by `create_stream` instead of ending its thread, and raised here, on the
        thread DCP gathers failures from; the item count is checked as well.
        """
        self.fs.errors.clear()
        future = super().write_data(plan, planner)  # returns once written (its extra threads joined)
        if self.fs.errors:
            raise self.fs.errors[0]
        missing = len(plan.items) - len(future.wait())  # a torch.futures.Future, already done
        if missing:
            raise OSError(f"{missing} of {len(plan.items)} checkpoint items were not written to {self.path}")
        return future


# Test hook, for tests/distributed/test_checkpoint.py only: EXATRAIN_TEST_SAVE_PAUSE="STEP:SECONDS" makes
# every rank but 0 sleep before writing its part of step STEP's checkpoint (rank 0 writes its files
# meanwhile), so that a test can kill -9 a rank while the save is in flight. Never set in real runs.
PAUSE_HOOK = "EXATRAIN_TEST_SAVE_PAUSE"


class _PausingWriter(CheckpointWriter):
    """The writer, sleeping before writing (see the test hook above)."""

    def __init__(self, path: Path, pause_s: float):
        super().__init__(path)
        self.pause_s = pause_s

    def write_data(self, plan, planner):
        time.sleep(self.pause_s)
        return super().write_data(plan, planner)


def checkpoint_writer(path: Path, step: int) -> FileSystemWriter:
    """The storage writer for step `step`'s checkpoint folder on this rank."""
    hook = os.environ.get(PAUSE_HOOK, "")
    if hook and rank() != 0 and int(hook.split(":")[0]) == step:
        return _PausingWriter(path, float(hook.split(":")[1]))
    return CheckpointWriter(path)
