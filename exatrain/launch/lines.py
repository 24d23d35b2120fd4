"""Whole lines on a rank's stdout and stderr, optionally labelled with the rank; installed by
`launch.script_runner` in every rank it starts. Never imports torch.

Why: torchrun (and exatrain, in each mode) starts workers with ``python -u``, where ``print("rank", r)`` is
one write per argument, so the lines of ranks that share a terminal, a pipe or a job log mix inside one line
(``rankrank 0 2.0\\n 1 2.0``). Here each stream is a text layer in line-buffered mode over `LineWriter`, which
hands the file descriptor complete lines only, in writes of at most ``PIPE_BUF`` bytes that end at a line
end: POSIX makes a pipe write of up to ``PIPE_BUF`` bytes atomic, and Linux makes a write to a regular
file (a shared log) atomic with respect to the file offset. An explicit ``flush()`` (a progress bar's ``\\r``
update) still writes a partial line at once, as C stdio's line buffering does.
"""

from __future__ import annotations

import collections
import io
import os
import select
import sys

PIPE_BUF = getattr(select, "PIPE_BUF", 4096)
_MAX_PARTIAL = 1 << 16  # a line longer than this is written in pieces rather than held without end
TAIL_LINES = 10  # how many of a rank's last lines are kept for a failure report


class LineWriter(io.RawIOBase):
    """A raw writable stream over ``fd`` that writes whole lines (see the module docstring), each begun by
    ``prefix``, and remembers the last lines written in ``tail`` (shared by stdout and stderr)."""

    def __init__(self, fd: int, prefix: bytes = b"", tail: collections.deque | None = None):
        super().__init__()
        self._fd, self._prefix, self.tail = fd, prefix, tail
        self._partial = bytearray()
        self._at_line_start = True

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data) -> int:
        """Keep ``data``; write out every line it completes."""
        data = bytes(data)
        self._partial += data
        end = self._partial.rfind(b"\n")
        if end >= 0:
            self._emit(bytes(self._partial[: end + 1]))
            del self._partial[: end + 1]
        if len(self._partial) > _MAX_PARTIAL:
            self.flush()
        return len(data)

    def flush(self) -> None:
        """Write out a partial line now (asked for explicitly, or a very long line)."""
        if self._partial and not self.closed:
            self._emit(bytes(self._partial))
            self._partial.clear()

    def _emit(self, text: bytes) -> None:
        chunk = bytearray()
        for line in text.splitlines(keepends=True):
            piece = (self._prefix if self._at_line_start else b"") + line
            self._at_line_start = line.endswith(b"\n")
            if self.tail is not None and self._at_line_start:
                self.tail.append(line.decode("utf-8", "replace").rstrip("\n"))
            if chunk and len(chunk) + len(piece) > PIPE_BUF:
                _write_all(self._fd, chunk)
                chunk = bytearray()
            chunk += piece
        if chunk:
            _write_all(self._fd, chunk)


def _write_all(fd: int, data: bytearray) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            select.select([], [fd], [])


def install(label: str = "") -> collections.deque:
    """Replace ``sys.stdout`` and ``sys.stderr`` by line writers on the same descriptors (``label`` begins
    each line); returns the deque of the last lines both wrote (for a failure report)."""
    tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
    prefix = label.encode()
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            fd = stream.fileno()
            stream.flush()
        except (AttributeError, OSError, ValueError):
            continue  # no stream, or one without a descriptor (a test harness's): left as it is
        raw = LineWriter(fd, prefix, tail)
        setattr(
            sys,
            name,
            io.TextIOWrapper(raw, encoding=stream.encoding, errors=stream.errors, line_buffering=True),
        )
    return tail


def record_failure(message: str, tail: collections.deque, path: str | None) -> None:
    """Write this rank's failure into torchrun's error file (``TORCHELASTIC_ERROR_FILE``, set by the agent
    for each worker) in the format of torch's ``@record`` (``ErrorHandler.record_exception``), with this
    rank's last lines and a timestamp in nanoseconds, so the agent can name the rank that failed first and
    show its last lines. A file the script's own ``@record`` wrote is kept; outside torchrun nothing is
    written."""
    if not path or os.path.exists(path):
        return
    import json
    import time

    now = time.time_ns()
    data = {
        "message": {
            "message": message,
            "extraInfo": {
                "py_callstack": "\n".join(tail),
                "timestamp": str(now // 10**9),
                "exatrain_time_ns": now,
                "exatrain_last_lines": list(tail),
            },
        }
    }
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:
        pass  # the report loses the last lines; the rank's exit code still says it failed
