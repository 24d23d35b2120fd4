"""`launch.hang_exit`: the thread that makes a rank which did not time out leave with its launch (MPICH's
mpiexec waits for every rank; the real thing: tests/e2e/test_mpich.py). Real threads on real files; only
the process exit is replaced by a record."""

import threading
import time

import pytest

from exatrain.launch import hang_exit

TOKEN = "127.0.0.1/29500"


@pytest.fixture
def left(monkeypatch):
    """The leave calls of the threads started with `_start` (an Event per thread)."""
    monkeypatch.setattr(hang_exit, "_reporting", threading.Event())
    monkeypatch.setattr(hang_exit, "_watched", threading.Event())
    monkeypatch.setattr(hang_exit, "GRACE_S", 20.0)
    return []


def _start(d, left):
    done = threading.Event()
    left.append(done)
    return hang_exit.start(d, TOKEN, "declared", interval_s=0.05, leave=done.set), done


def _declare(d, token=TOKEN):
    (d / "declared").unlink(missing_ok=True)  # as stack_dump._claim and the watcher do: a new file
    (d / "declared").write_text(token)


def test_a_rank_leaves_once_its_launch_declared_and_the_diagnosis_is_written(tmp_path, left):
    _, done = _start(tmp_path, left)
    _declare(tmp_path)
    assert not done.wait(0.5)  # declared, the leader still diagnosing
    (tmp_path / "diagnosis.txt").write_text("exatrain: HANG ...\n")
    assert done.wait(5)


def test_an_earlier_launchs_files_and_another_launchs_declaration_are_ignored(tmp_path, left):
    _declare(tmp_path)  # the same token: an earlier mpirun with the same MASTER_PORT
    (tmp_path / "diagnosis.txt").write_text("the earlier launch's\n")
    _, done = _start(tmp_path, left)
    assert not done.wait(0.5)
    time.sleep(0.01)  # a later modification time than the earlier launch's files
    _declare(tmp_path, "another launch")
    assert not done.wait(0.5)
    _declare(tmp_path)
    assert not done.wait(0.5)  # the diagnosis is older than the declaration
    (tmp_path / "diagnosis.txt").write_text("this launch's\n")
    assert done.wait(5)


def test_a_diagnosis_without_a_declaration_ends_nothing(tmp_path, left):
    """`exatrain dump RUN_DIR` writes the attempt's diagnosis.txt of a healthy run: it must keep running."""
    _, done = _start(tmp_path, left)
    (tmp_path / "diagnosis.txt").write_text("exatrain: HANG (dump requested): ...\n")
    assert not done.wait(0.5)
    _declare(tmp_path)  # still watching (and so the thread ends)
    time.sleep(0.01)
    (tmp_path / "diagnosis.txt").write_text("exatrain: HANG ...\n")
    assert done.wait(5)


def test_without_a_diagnosis_the_rank_leaves_after_the_grace(tmp_path, left, monkeypatch):
    monkeypatch.setattr(hang_exit, "GRACE_S", 0.5)
    _, done = _start(tmp_path, left)
    _declare(tmp_path)
    assert done.wait(5)


def test_a_rank_reporting_its_own_timeout_is_left_to_that_path(tmp_path, left):
    thread, done = _start(tmp_path, left)
    hang_exit.reporting()
    _declare(tmp_path)
    (tmp_path / "diagnosis.txt").write_text("exatrain: HANG ...\n")
    thread.join(5)
    assert not thread.is_alive() and not done.is_set()


def test_a_process_with_a_hang_watcher_is_left_to_the_watcher(tmp_path, left):
    """observe.hang's watcher ends its process itself, after gathering every rank's report, which may take
    longer than the grace: this thread must not end the leader half-way."""
    from exatrain.observe.hang import start_watcher, stop_watcher

    thread, done = _start(tmp_path, left)
    start_watcher(tmp_path / "run", 0, 1, 3600, host="here")
    try:
        _declare(tmp_path)
        (tmp_path / "diagnosis.txt").write_text("exatrain: HANG ...\n")
        thread.join(5)
        assert not thread.is_alive() and not done.is_set()
    finally:
        stop_watcher()
    assert not hang_exit._watched.is_set()  # a stopped watcher hands the exit back
