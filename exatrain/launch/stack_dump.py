"""Every rank's stacks for scripts that use none of exatrain's API (docs/hangs.md, issue 25).

Under `exatrain run` (unless `--hang-timeout 0`) the script runner calls `install()` before the script
starts: it registers `faulthandler` for SIGUSR1 (all threads, appended to
RUN_DIR/hang/attempt-K/stacks-rank-N.txt; the handler is C code, so it dumps a rank blocked inside gloo or
sleeping, at once) and records the rank's pid and host in pid-rank-N.json. Then:

- `exatrain dump RUN_DIR` (`dump_run`) signals every rank of the run on this host (`py-spy dump
  --nonblocking` for a stopped one, which cannot run a handler) and prints one diagnosis; `exatrain dump
  JOBID` (tools.dump) runs `signal_run` on every node of a SLURM job, then diagnoses without signalling;
- when the script dies of a collective timeout (`on_collective_timeout`), its traceback goes to its stacks
  file instead of the terminal, and the first rank to get there does what `exatrain dump` does for the
  others. Every such rank exits with EXIT_HANG: one paragraph instead of N identical tracebacks; the
  ranks that did not time out (the one the others waited for) leave with EXIT_HANG too once the diagnosis
  is written (`launch.hang_exit`: MPICH's mpiexec would wait for them forever).

The diagnosis names the ranks whose main thread is outside any torch.distributed call (the ranks the others
wait for) and where each stands. `exatrain dump RUN_DIR` signals only ranks on its own host (the local
`exatrain run --nproc N` path); ranks on other nodes are listed as without a stack.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

from exatrain.env.watch import HangRequest, hang_request, run_token
from exatrain.errors import EXIT_HANG
from exatrain.files import read_json, write_json, write_text
from exatrain.launch import hang_exit
from exatrain.launch.stacks import frames_of, pyspy_path, stall_frame, where

DUMP_SIGNAL = signal.SIGUSR1
DECLARED = "declared"  # the same file the hang watcher (observe.hang) uses: one leader per launch
_TIMEOUT = re.compile(r"timed out|timeout", re.IGNORECASE)
_DIST = "/torch/distributed/"
_open_files: list = []  # the stacks file stays open for faulthandler while the script runs


def attempt_dir(req: HangRequest) -> Path:
    """RUN_DIR/hang/attempt-K of this rank's launch (K: torchrun's restart count)."""
    return Path(req.run_dir) / "hang" / f"attempt-{req.attempt}"


def install() -> HangRequest | None:
    """Before the script: the SIGUSR1 stack dump and the pid record, when `exatrain run` asked for them (None
    otherwise, or when the run directory cannot be written without a hang timeout asked for: nothing is
    written then, and rank 0 says so once)."""
    req = hang_request()
    if req is None:
        return None
    d = attempt_dir(req)
    try:
        d.mkdir(parents=True, exist_ok=True)
        stacks = open(d / f"stacks-rank-{req.rank}.txt", "a")  # append: `exatrain dump` empties it first
    except OSError as e:
        if req.watch:  # asked for by --hang-timeout: the user must know now
            raise
        if req.rank == 0:
            print(f"exatrain: note: no stack dumps for this run ({d}: {e.strerror})", file=sys.stderr)
        return None
    stacks.truncate(0)
    _open_files.append(stacks)
    faulthandler.register(DUMP_SIGNAL, file=stacks, all_threads=True)
    record = {"rank": req.rank, "pid": os.getpid(), "host": req.host, "token": run_token()}
    write_json(d / f"pid-rank-{req.rank}.json", record)
    hang_exit.start(d, record["token"], DECLARED)  # the rank the others wait for leaves with them
    return req


def is_collective_timeout(e: BaseException) -> bool:
    """Whether `e` is torch.distributed's timeout (gloo: "Timed out waiting ...ms for recv operation";
    NCCL's watchdog: "... collective operation timeout"), raised inside a torch.distributed call."""
    if not _TIMEOUT.search(str(e)):
        return False
    return any(_DIST in f.filename for f in traceback.extract_tb(e.__traceback__))


def on_collective_timeout(e: BaseException, req: HangRequest) -> int:
    """The script died of a collective timeout: its traceback to its stacks file, the diagnosis (by the
    first rank here: it signals the others) printed once; returns EXIT_HANG."""
    hang_exit.reporting()  # this rank leaves by returning, after its files: not by hang_exit's thread
    d = attempt_dir(req)
    frames = [(f.filename, f.lineno, f.name) for f in reversed(traceback.extract_tb(e.__traceback__))]
    text = f"Collective timeout in rank {req.rank}: {type(e).__name__}: {str(e).splitlines()[0]}\n"
    text += "Stack (most recent call first):\n"
    text += "".join(f'  File "{file}", line {line} in {func}\n' for file, line, func in frames)
    write_text(d / f"timeout-rank-{req.rank}.txt", text)  # its own file: a leader's SIGUSR1 may come too
    if _claim(d / DECLARED, run_token()):
        dump_attempt(d, f"a collective timed out in rank {req.rank}", skip={req.rank}, say=_print_err)
    else:  # the leader diagnoses; leaving before it printed would let the launcher stop it half-way
        since, deadline = (d / f"timeout-rank-{req.rank}.txt").stat().st_mtime, time.monotonic() + 20
        while not _written_since(d / "diagnosis.txt", since) and time.monotonic() < deadline:
            time.sleep(0.2)
    return EXIT_HANG


def dump_run(run_dir, ask: bool = True) -> tuple[str, bool]:
    """`exatrain dump RUN_DIR`: signal the ranks of the newest attempt in RUN_DIR/hang/ that run on this host
    (all of them were signalled on their own nodes already when `ask` is False: `exatrain dump JOBID`),
    return (the diagnosis, whether every rank's stack was read)."""
    d = _newest_attempt(run_dir)
    if d is None:
        return "", False
    text = dump_attempt(d, "dump requested", ask=ask)
    return text, "without a stack" not in text


def signal_run(run_dir) -> list[int]:
    """Make the ranks of the newest attempt in RUN_DIR/hang/ that run on this host dump their stacks (what
    each node does for `exatrain dump JOBID`); returns their ranks."""
    d = _newest_attempt(run_dir)
    return (
        [rank for rank, rec in _records(d).items() if not _timed_out(d, rank) and _ask(d, rec)] if d else []
    )


def _newest_attempt(run_dir) -> Path | None:
    attempts = sorted(Path(run_dir, "hang").glob("attempt-*/pid-rank-*.json"), key=_attempt_number)
    return attempts[-1].parent if attempts else None


def _records(d: Path) -> dict[int, dict]:
    """The pid records of the newest launch in attempt folder `d` (an earlier launch in the same run
    directory left its own)."""
    found = [r for r in map(read_json, sorted(d.glob("pid-rank-*.json"), key=_mtime)) if r]
    return {r["rank"]: r for r in found if r.get("token") == found[-1].get("token")} if found else {}


def dump_attempt(d: Path, why: str, skip: set[int] = frozenset(), ask: bool = True, say=None) -> str:
    """Signal every recorded rank of attempt folder `d` on this host but `skip` (none when not `ask`), read
    all stacks, write and return the diagnosis; `say(text)` (the collective timeout's leader: print it) runs
    before the attempt's diagnosis.txt, which the other ranks wait for, is written."""
    records = _records(d)
    for rank, rec in records.items():  # a rank that died of the timeout wrote its traceback: not asked
        if ask and rank not in skip and not _timed_out(d, rank):
            _ask(d, rec)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not all(_dumped(d, r) for r in records):
        time.sleep(0.1)
    time.sleep(0.2)  # a dump that has begun is written in full within microseconds; be generous
    text = diagnose_stacks(records, {r: _stacks(d, r) for r in records}, why) + (
        f" Every rank's stacks: {d}/stacks-rank-N.txt; this text: {d.parent / 'diagnosis.txt'}."
    )
    write_text(d.parent / "diagnosis.txt", text + "\n")
    if say is not None:
        say(text)
    # last: the ranks waiting in on_collective_timeout exit once it is there, and the first exit makes the
    # launcher (mpirun at once, torchrun's agent at its next poll) stop the leader too
    write_text(d / "diagnosis.txt", text + "\n")
    return text


def _print_err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def diagnose_stacks(records: dict[int, dict], stacks: dict[int, str], why: str) -> str:
    """One paragraph from the ranks' stack texts: the ranks outside torch.distributed first (the ones the
    others wait for), then where the others wait; ranks without a stack are listed."""
    outside, waiting, missing = [], {}, []
    for rank in sorted(records):
        frames = frames_of(stacks.get(rank, ""))
        if not frames:
            missing.append(rank)
        elif any(_DIST in f[0] for f in frames):
            waiting.setdefault(_waiting_in(frames), []).append(rank)
        else:
            outside.append((rank, where(stall_frame(frames))))
    parts = [
        f"rank {rank} ({records[rank].get('host', '?')}, pid {records[rank].get('pid', '?')}) is outside any "
        f"torch.distributed call, at {place}"
        for rank, place in outside
    ]
    parts += [f"rank(s) {_ranks(ranks)} wait in {place}" for place, ranks in waiting.items()]
    if missing:
        parts.append(
            f"rank(s) {_ranks(missing)} without a stack (not running, or not on a node that was asked?)"
        )
    return f"exatrain: HANG ({why}): " + "; ".join(parts) + "."


def _waiting_in(frames: list[tuple[str, int, str]]) -> str:
    """'torch.distributed.all_reduce at train.py:30 (main): dist.all_reduce(t)'."""
    c10d = [f for f in frames if f[0].endswith("distributed_c10d.py")]
    call = f"torch.distributed.{c10d[-1][2]}" if c10d else "torch.distributed"
    return f"{call} at {where(stall_frame(frames))}"


def _ask(d: Path, rec: dict) -> bool:
    """Make rank `rec` dump its stacks: SIGUSR1, or py-spy for a stopped process. False when it is not on
    this host or not running."""
    pid, path = int(rec["pid"]), d / f"stacks-rank-{rec['rank']}.txt"
    if rec.get("host") != socket.gethostname() or not _alive(pid):
        return False
    if _stopped(pid):
        exe = pyspy_path()
        if exe is None:
            return False
        cmd = [exe, "dump", "--nonblocking", "--full-filenames", "--pid", str(pid)]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
        path.write_text(run.stdout + run.stderr)
        return True
    path.write_text("")  # the rank's handler appends: the file then holds this dump only
    os.kill(pid, DUMP_SIGNAL)
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def _stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP, state T in /proc/PID/stat): it cannot run a handler."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _written_since(path: Path, since: float) -> bool:
    return path.exists() and _mtime(path) >= since


def _timed_out(d: Path, rank: int) -> bool:
    return (d / f"timeout-rank-{rank}.txt").exists()


def _dumped(d: Path, rank: int) -> bool:
    """Whether rank's stacks are there: its timeout traceback, or a signal dump not taken while it was
    itself reporting a timeout (it then writes its traceback within moments)."""
    text = _stacks(d, rank)
    return _timed_out(d, rank) or (bool(text) and "on_collective_timeout" not in text)


def _stacks(d: Path, rank: int) -> str:
    """The rank's stacks: its traceback at a collective timeout, else its latest signal or py-spy dump."""
    for name in (f"timeout-rank-{rank}.txt", f"stacks-rank-{rank}.txt"):
        try:
            return (d / name).read_text()
        except OSError:
            continue
    return ""


def _claim(path: Path, token: str) -> bool:
    """Create `path` holding `token` unless a rank of this launch did: True for the one rank that did."""
    try:
        if path.read_text() != token:
            path.unlink()  # an earlier launch's
    except OSError:
        pass
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(token)
    return True


def _ranks(ranks) -> str:
    return ",".join(map(str, ranks))


def _attempt_number(path: Path) -> int:
    return int(path.parent.name.rsplit("-", 1)[1])
