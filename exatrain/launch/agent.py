"""torchrun's elastic agent, run in this process by `exatrain.launch.local` and by torchrun-mode batch scripts
(``python -m exatrain.launch.agent [--handle-signals=SIGUSR2 [--shutdown-grace=S]] -- TORCHRUN_ARGS``):
torchrun's arguments and behaviour, but a failed worker ends the run with one plain message naming its rank,
and with that worker's exit code instead of torchrun's traceback and 1.

It runs where the ranks run (the compute node, inside the container) and decides there, from the installed
torch's version (read without importing torch), what torchrun is asked for: a torch older than exatrain's
floor stops it at once with a HINT; torch >= 2.12 gets ``--signals-to-handle``/``--shutdown-timeout``; an
older torch, whose agent handles only TERM/INT/HUP/QUIT and dies of SIGUSR2, gets the same behaviour from this
module (forward, then wait for the workers; see SignalForwarder and docs/torch-versions.md).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from exatrain.env.torch_version import check_torch_floor, torch_version
from exatrain.errors import EXIT_HANG, ExatrainError
from exatrain.launch import exit_barrier
from exatrain.slurm.rendezvous import LOCAL_ADDR_SINCE
from exatrain.slurm.torchrun_line import GRACE, HANDLE, extra_signals, native_signal_handling, signal_options


def split_options(argv: list[str]) -> tuple[str, int | None, list[str]]:
    """exatrain's own leading options (signal names, grace seconds), then torchrun's arguments (after an
    optional ``--``)."""
    names, grace, rest = "", None, list(argv)
    while rest and rest[0].split("=")[0] in (HANDLE, GRACE):
        key, _, value = rest.pop(0).partition("=")
        if key == HANDLE:
            names = value
        else:
            grace = int(value)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    return names, grace, rest


def worker_pids(parent: int) -> list[int]:
    """The live child processes of ``parent`` (torchrun's workers are the agent's children: it Popens each
    one, in its own session), read from /proc so that no torch-internal API is needed."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended while we looked
        if int(fields[1]) == parent and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return sorted(pids)


class SignalForwarder:
    """What torchrun >= 2.12 does with ``--signals-to-handle`` and ``--shutdown-timeout``, for an older torch:
    a handled signal is passed to every worker, and the agent keeps monitoring them, i.e. waits until they
    have checkpointed and exited (torch's monitor loop ends the run as for any exit). After ``grace``
    seconds it stops them as torchrun stops workers (SignalException: SIGTERM, then SIGKILL 30 s later).
    A signal before the workers exist ends the agent, as it ends torchrun's before its handlers are set."""

    def __init__(self, names: list[str], grace: int | None):
        self.signals = [signal.Signals[name] for name in names]
        self.grace = grace
        self.armed = False

    def install(self) -> None:
        """Handle the signals in this process (the agent), before torch's agent starts the workers."""
        for sig in self.signals:
            signal.signal(sig, self._forward)

    def _forward(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        pids = worker_pids(os.getpid())
        if not pids:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        wait = f"up to {self.grace} s" if self.grace else "until they exit"
        os.write(
            2, f"exatrain: the agent received {name}: passed it to workers {pids}; waiting {wait}\n".encode()
        )
        if self.grace and not self.armed:
            self.armed = True
            signal.signal(signal.SIGALRM, self._grace_over)
            signal.alarm(self.grace)

    def _grace_over(self, signum: int, frame) -> None:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        raise SignalException(f"workers still running {self.grace} s after the signal", sigval=signal.SIGTERM)


def prepare(argv: list[str], version: tuple[int, int, int]) -> tuple[list[str], SignalForwarder | None]:
    """torchrun's arguments for the job's torch ``version`` (exatrain's options turned into torchrun's where
    that torch has them), and the forwarder that stands in for them where it does not."""
    names, grace, args = split_options(argv)
    args = _without_unknown_local_addr(args, version)
    if native_signal_handling(version) or not extra_signals(names):
        return [*signal_options(version, names, grace), *args], None
    return args, SignalForwarder(extra_signals(names), grace)


def _without_unknown_local_addr(args: list[str], version: tuple[int, int, int]) -> list[str]:
    """torchrun's arguments without ``--local-addr`` where the node's torch predates it (2.5, as
    slurm/rendezvous.py says): a torch 2.4 torchrun rejects the option, so its workers then get the agent's
    own host name as MASTER_ADDR, with a note saying so."""
    if version >= LOCAL_ADDR_SINCE + (0,):
        return args
    kept = [a for a in args if not a.startswith("--local-addr=") and not a.startswith("--local_addr=")]
    if len(kept) != len(args):
        print(
            f"exatrain: note: torch {'.'.join(map(str, version))} has no --local-addr (torch >= "
            "2.5): its workers "
            "get this node's plain host name as MASTER_ADDR",
            file=sys.stderr,
            flush=True,
        )
    return kept


def failure_exit_code(exitcode: int) -> int:
    """A worker's exit code as a shell reports it: killed by signal N (torch: -N) becomes 128 + N."""
    return 128 - exitcode if exitcode < 0 else exitcode or 1


def describe_failure(rank: int, failure, others: int) -> str:
    """One line (plus a HINT) naming the first worker that failed, its exit code or signal."""
    if failure.exitcode == EXIT_HANG:
        return (
            f"a hang stopped the workers (rank {rank} first, exit code {EXIT_HANG}): the diagnosis "
            "above names the rank that stalled and where (also in RUN_DIR/hang/diagnosis.txt)\n"
            "HINT: every rank's stacks are in RUN_DIR/hang/attempt-K/; `--max-restarts K` restarts the "
            "workers from the last checkpoint instead"
        )
    how = f"exit code {failure.exitcode}"
    if failure.exitcode < 0:
        try:
            how = f"signal {signal.Signals(-failure.exitcode).name}"
        except ValueError:
            how = f"signal {-failure.exitcode}"
    more = f"; {others} other worker(s) ended with it" if others else ""
    first = " first" if others else ""
    return (
        f"rank {rank} (local rank {failure.local_rank}, pid {failure.pid}) failed{first} with {how}"
        f"{_reported(failure)}{more}\n{_last_lines(rank, failure)}"
        "HINT: that rank's own output above says why; `--max-restarts K` lets torchrun's agent restart "
        "the workers after a failure"
    )


def _reported(failure) -> str:
    """The first line of the error a worker reported in torchrun's error file (scripts whose main is
    decorated with torch's ``@record``), else nothing."""
    data = failure.error_file_data or {}
    message = data.get("message")
    if message in (None, "<NONE>"):
        return ""
    text = str(message.get("message", "") if isinstance(message, dict) else message).strip()
    return f": {text.splitlines()[0]}" if text else ""


def _extra(failure) -> dict:
    message = (failure.error_file_data or {}).get("message")
    return message.get("extraInfo", {}) if isinstance(message, dict) else {}


def _last_lines(rank: int, failure) -> str:
    """The failed rank's last lines of output, as `launch.script_runner` recorded them, indented."""
    last = _extra(failure).get("exatrain_last_lines") or []
    return "".join([f"rank {rank}'s last lines:\n", *(f"    {line}\n" for line in last)]) if last else ""


def first_failure(failures: dict):
    """(rank, failure) of the worker that failed first: by the script runner's nanosecond time where it
    recorded one (torch's own choice compares whole seconds, and then takes the lowest rank); then workers
    that reported an error (torch's ``@record`` error file) or exited with a code, by the failure's own
    timestamp; workers that died of a signal (the agent's SIGTERM after another failed) last."""

    def when(rank: int):
        failure = failures[rank]
        ns = _extra(failure).get("exatrain_time_ns")
        if isinstance(ns, int):
            return (0, ns, rank)
        signalled = failure.exitcode is not None and failure.exitcode < 0 and not _reported(failure)
        return (2 if signalled else 1, failure.timestamp, rank)

    rank = min(failures, key=when)
    return rank, failures[rank]


def main(argv: list[str] | None = None) -> int:
    """Run the workers to completion; 0, or the first failed worker's exit code (2: the job's torch cannot run
    exatrain, said with a HINT before anything starts)."""
    try:
        version = check_torch_floor(torch_version(), sys.executable)
    except ExatrainError as e:
        print(f"exatrain: error: {e}", file=sys.stderr, flush=True)
        return 2
    args, forwarder = prepare(sys.argv[1:] if argv is None else argv, version)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    if forwarder:
        forwarder.install()
    exit_barrier.install()  # the agent hosting the rendezvous store leaves last (pytorch/pytorch#69520)
    try:
        try:
            run(parse_args(args))
        finally:
            signal.alarm(0)  # the forwarder's grace, if armed: the workers have ended
    except SignalException as e:  # a handled signal: the agent passed it to the workers and stopped
        print(
            f"exatrain: the agent received {e.sigval.name} and passed it to the workers",
            file=sys.stderr,
            flush=True,
        )
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        rank, failure = first_failure(e.failures)
        print(
            f"exatrain: error: {describe_failure(rank, failure, len(e.failures) - 1)}",
            file=sys.stderr,
            flush=True,
        )
        return failure_exit_code(failure.exitcode)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
