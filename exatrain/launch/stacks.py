"""Reading Python stacks: the frames of a `faulthandler` dump or a `py-spy dump`, and the frame to name as a
rank's stall line (the innermost frame of its main thread in the user's own code, outside the standard
library and installed packages; exatrain's own frames count only when nothing else is there).

Pure functions, torch-free: the script runner (`launch.script_runner`), the hang watcher (`observe.hang`)
and `exatrain dump` share them.
"""

from __future__ import annotations

import linecache
import re
import shutil
import sys
import sysconfig
from pathlib import Path

_LIBRARY_DIRS = tuple(
    {str(Path(sysconfig.get_paths()[k]).resolve()) for k in ("stdlib", "purelib", "platlib")}
)
_EXATRAIN_DIR = str(Path(__file__).resolve().parents[1])
_PYSPY_FRAME = re.compile(r"^\s+(?P<func>\S.*?) \((?P<file>[^()]+):(?P<line>\d+)\)\s*$")


def _is_library(filename: str) -> bool:
    path = str(Path(filename).resolve()) if filename.startswith("/") else filename
    return path.startswith(_LIBRARY_DIRS) or filename.startswith("<")


def stall_frame(frames: list[tuple[str, int, str]]) -> tuple[str, int, str] | None:
    """The frame to name, from (file, line, function) innermost first: the user's code, else exatrain's,
    else the innermost."""
    own = [f for f in frames if not _is_library(f[0])]
    users = [f for f in own if not str(Path(f[0]).resolve()).startswith(_EXATRAIN_DIR)]
    return (users or own or frames or [None])[0]


def pyspy_frames(text: str) -> list[tuple[str, int, str]]:
    """(file, line, function) of the first thread in `py-spy dump` output, innermost first."""
    frames, seen_thread = [], False
    for line in text.splitlines():
        if line.startswith("Thread "):
            if seen_thread:
                break
            seen_thread = True
            continue
        m = _PYSPY_FRAME.match(line)
        if m and seen_thread:
            frames.append((m["file"], int(m["line"]), m["func"]))
    return frames


def where(frame) -> str:
    """`file:line (function): source line` of a stall frame, or 'an unknown place'."""
    if not frame:
        return "an unknown place"
    file, line, func = frame
    source = linecache.getline(file, line).strip()
    return f"{file}:{line} ({func})" + (f": {source}" if source else "")


_FAULTHANDLER_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_MAIN_MARK = "script_runner.py"  # the bottom frames of a rank's main thread under `exatrain run`


def faulthandler_frames(text: str) -> list[tuple[str, int, str]]:
    """(file, line, function) of the main thread in a `faulthandler` dump (all threads), innermost first:
    the thread whose frames include exatrain's script runner, else the last thread listed (the oldest)."""
    threads: list[list[tuple[str, int, str]]] = []
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x", "Stack (most recent call first)")):
            threads.append([])
            continue
        m = _FAULTHANDLER_FRAME.match(line)
        if m and threads:
            threads[-1].append((m["file"], int(m["line"]), m["func"]))
    main = [t for t in threads if any(f[0].endswith(_MAIN_MARK) for f in t)]
    return (main or threads or [[]])[-1]


def frames_of(text: str) -> list[tuple[str, int, str]]:
    """The main thread's frames of a stacks file written by faulthandler or by `py-spy dump`."""
    return faulthandler_frames(text) or pyspy_frames(text)


def pyspy_path() -> str | None:
    """The py-spy executable on PATH or beside this Python (a venv's bin), None without one."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return exe if Path(exe).exists() else None
