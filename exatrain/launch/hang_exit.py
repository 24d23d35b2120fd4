"""The rank that did not time out leaves too: after a collective-timeout diagnosis every rank of the launch
exits with EXIT_HANG, not only the ranks that raised the timeout (docs/hangs.md).

At a collective timeout of an unmodified script (`stack_dump.on_collective_timeout`) the ranks waiting in
the collective raise and exit with EXIT_HANG, but the rank they waited for (asleep, in a loop, blocked in
I/O) never raises. torchrun's agent and Open MPI's mpirun stop it once another rank has exited; MPICH's
Hydra (`mpiexec`, measured with 4.0.2) does not: it waits for every rank while none calls MPI itself, so
the job would stay up until its time limit, and SLURM's srun does the same without `--kill-on-bad-exit`.
So every rank watches, from a daemon thread, for its launch's declaration (the `declared` file holding
the run token, which only a real hang writes: `exatrain dump` does not) and ends its process with
EXIT_HANG once the leader wrote the attempt's diagnosis.txt (or `GRACE_S` after the declaration, when no
leader finishes). Exiting with the ranks' own code keeps the launcher's code 76: Hydra returns the
bitwise OR of its ranks' exit codes, and a rank killed by a signal would make it the signal's number.

A rank blocked in C code that holds Python's lock (or a stopped process) runs no thread: its launcher
must stop it. The cost: one small read per rank every `interval_s`, as the hang watcher's beat.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from exatrain.errors import EXIT_HANG

#: how often each rank looks for its launch's declaration
INTERVAL_S = 2.0
#: after the declaration, how long a rank waits for the leader's diagnosis before it leaves without one
GRACE_S = 20.0
_reporting = threading.Event()  # set while this rank reports its own timeout: it leaves by that path
_watched = threading.Event()  # set while a hang watcher runs here: it ends the process itself


def reporting() -> None:
    """This rank reports its own collective timeout (it exits with EXIT_HANG itself, after its files)."""
    _reporting.set()


def watched(running: bool = True) -> None:
    """A hang watcher (observe.hang) runs in this process, or (`running=False`) no longer does. While one
    runs, this thread leaves the process alone: the watcher reports the rank, the leader's diagnosis may take
    longer than GRACE_S to gather every rank, and the watcher then ends the process itself."""
    (_watched.set if running else _watched.clear)()


def start(
    attempt: Path, token: str, declared: str, interval_s: float = INTERVAL_S, leave=None
) -> threading.Thread:
    """Start the daemon thread that ends this process with EXIT_HANG (or calls `leave`) after its launch
    declared a hang in folder `attempt` (a new file `declared` holding `token`) and the diagnosis is
    written."""
    thread = threading.Thread(
        target=_watch,
        # a file there already is an earlier launch's (the same token: the same MASTER_PORT, say)
        args=(attempt / declared, token, _identity(attempt / declared), interval_s, leave or _leave),
        name="exatrain-hang-exit",
        daemon=True,
    )
    thread.start()
    return thread


def _watch(path: Path, token: str, earlier: tuple[int, int] | None, interval_s: float, leave) -> None:
    while (found := _identity(path)) in (None, earlier) or not _holds(path, token):
        time.sleep(interval_s)
    since = found[1]  # a diagnosis.txt older than the declaration is an earlier launch's
    deadline = time.monotonic() + GRACE_S
    while (_identity(path.with_name("diagnosis.txt")) or (0, 0))[1] < since and time.monotonic() < deadline:
        time.sleep(0.2)
    if not (_reporting.is_set() or _watched.is_set()):
        leave()


def _identity(path: Path) -> tuple[int, int] | None:
    """(inode, mtime in ns) of `path`, None when it is not there: a new declaration is a new file."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _holds(path: Path, token: str) -> bool:
    try:
        return path.read_text() == token
    except OSError:
        return False


def _leave() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_HANG)
