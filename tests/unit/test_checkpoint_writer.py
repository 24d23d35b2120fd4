"""The tuned checkpoint writer: files stay in DCP's format, early write-back keeps every byte, CRC
restored."""

import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from exatrain.checkpoint.store import fsync_dir
from exatrain.checkpoint.writer import CheckpointWriter, WritebackFile


def _state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "big": torch.randn(512, 1024, generator=g),
        "small": torch.randn(7, generator=g),
        "step": torch.tensor(3.0),
        "note": "text",
    }


def test_writeback_file_keeps_every_byte_and_starts_writeback_per_chunk(tmp_path, monkeypatch):
    """A spy on posix_fadvise (the real call still runs) counts the write-back requests."""
    calls = []
    real = os.posix_fadvise
    monkeypatch.setattr(
        os, "posix_fadvise", lambda fd, off, n, adv: (calls.append((off, n, adv)), real(fd, off, n, adv))
    )
    blocks = [os.urandom(300_000) for _ in range(10)]
    with WritebackFile(tmp_path / "f.bin", chunk=1 << 20) as f:
        for b in blocks:
            f.write(b)
    assert (tmp_path / "f.bin").read_bytes() == b"".join(blocks)
    assert [c[2] for c in calls] == [os.POSIX_FADV_DONTNEED] * 2  # after 1.2 MB and 2.4 MB of 3 MB
    assert calls[0][0] == 0 and calls[1][0] == calls[0][1]  # consecutive ranges from the start


def test_a_file_system_refusing_the_advice_still_gets_every_byte(tmp_path, monkeypatch):
    calls = []

    def refuse(fd, offset, length, advice):
        calls.append(offset)
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(os, "posix_fadvise", refuse)
    blocks = [os.urandom(300_000) for _ in range(10)]
    with WritebackFile(tmp_path / "f.bin", chunk=1 << 20) as f:
        for b in blocks:
            f.write(b)
    assert (tmp_path / "f.bin").read_bytes() == b"".join(blocks)
    assert calls == [0]  # asked once, then left to the final fsync


def test_checkpoint_written_by_it_reads_with_dcps_own_reader_and_converter(tmp_path):
    state = _state()
    assert torch.serialization.get_crc32_options()
    dcp.save(state, storage_writer=CheckpointWriter(tmp_path / "ckpt"))
    assert torch.serialization.get_crc32_options(), "the CRC switch must be restored after the write"
    assert len(list((tmp_path / "ckpt").glob("*.distcp"))) == 2  # 2 writer threads, a file each

    loaded = {k: torch.zeros_like(v) if torch.is_tensor(v) else None for k, v in state.items()}
    dcp.load(loaded, storage_reader=FileSystemReader(tmp_path / "ckpt"))
    for key in ("big", "small", "step"):
        assert torch.equal(loaded[key], state[key]), key
    dcp_to_torch_save(tmp_path / "ckpt", tmp_path / "full.pt")
    full = torch.load(tmp_path / "full.pt", weights_only=True)
    assert torch.equal(full["big"], state["big"]) and full["note"] == "text"


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("failing", ["__0_0.distcp", "__0_1.distcp"])
def test_a_failed_write_in_either_thread_fails_the_save(tmp_path, monkeypatch, failing):
    """A full disk, simulated by a failing write (ENOSPC cannot be provoked safely here), on one of the two
    files: DCP's extra writer thread would only print its exception and commit a checkpoint without its
    tensors; the writer must raise whichever thread writes the file. The CRC switch is off while writing
    and restored after."""
    real_write = WritebackFile.write

    def write(self, data):
        assert not torch.serialization.get_crc32_options()
        if self.name.endswith(failing):
            raise OSError(28, "No space left on device")
        return real_write(self, data)

    monkeypatch.setattr(WritebackFile, "write", write)
    for _ in range(3):  # which thread takes which file varies
        with pytest.raises(BaseException, match="No space left"):  # DCP wraps it in its CheckpointException
            dcp.save(_state(), storage_writer=CheckpointWriter(tmp_path / "ckpt"))
    assert torch.serialization.get_crc32_options()


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("failing", ["__0_0.distcp", "__0_1.distcp"])
def test_a_file_that_cannot_be_created_fails_the_save_without_a_thread_traceback(tmp_path, failing):
    """A folder in the way of one data file: its open fails in whichever thread takes it; the save raises
    that error once, and no writer thread dies with a traceback on stderr."""
    (tmp_path / "ckpt" / failing).mkdir(parents=True)
    with pytest.raises(BaseException, match="Is a directory"):
        dcp.save(_state(), storage_writer=CheckpointWriter(tmp_path / "ckpt"))
    assert torch.serialization.get_crc32_options()


def test_fsync_dir_syncs_folders_closes_them_and_ignores_missing_ones(tmp_path, monkeypatch):
    """Spies on os.open/os.fsync/os.close (the real calls still run): the folder itself is synced through
    one descriptor that is closed again; a missing folder and a file system refusing fsync are no errors."""
    opened, synced, closed = [], [], []
    real_open, real_fsync, real_close = os.open, os.fsync, os.close
    monkeypatch.setattr(
        os, "open", lambda p, flags, *a: opened.append((str(p), real_open(p, flags, *a))) or opened[-1][1]
    )
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    monkeypatch.setattr(os, "close", lambda fd: (closed.append(fd), real_close(fd))[1])

    fsync_dir(tmp_path)
    assert [p for p, _ in opened] == [str(tmp_path)]
    assert synced == [opened[0][1]] and closed == [opened[0][1]]

    fsync_dir(tmp_path / "missing")
    assert len(opened) == 1 and len(synced) == 1, "a missing folder is neither opened nor synced"

    def refuse(fd):
        synced.append(fd)
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(os, "fsync", refuse)
    fsync_dir(tmp_path)
    assert len(synced) == 2 and closed == [opened[0][1], opened[1][1]], "closed even when fsync is refused"
