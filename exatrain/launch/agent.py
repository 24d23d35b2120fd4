"""torchrun's elastic agent, run in this process by `exatrain.launch.local` (``python -m exatrain.launch.agent
TORCHRUN_ARGS``): the same arguments and behaviour as ``torchrun``, but a failed worker ends the run with
one plain message naming its rank, and with that worker's exit code instead of torchrun's traceback and 1.
"""

from __future__ import annotations

import signal
import sys

from exatrain.errors import EXIT_HANG


def failure_exit_code(exitcode: int) -> int:
    """A worker's exit code as a shell reports it: killed by signal N (torch: -N) becomes 128 + N."""
    return 128 - exitcode if exitcode < 0 else exitcode or 1


def describe_failure(rank: int, failure, others: int) -> str:
    """One line (plus a HINT) naming the first worker that failed, its exit code or signal."""
    if failure.exitcode == EXIT_HANG:
        return (f"the hang watcher stopped the workers (rank {rank} first, exit code {EXIT_HANG}): the diagnosis "
                "above names the rank that stalled and where (also in RUN_DIR/hang/diagnosis.txt)\n"
                "HINT: every rank's stacks are in RUN_DIR/hang/attempt-K/; `--max-restarts K` restarts the "
                "workers from the last checkpoint instead")
    how = f"exit code {failure.exitcode}"
    if failure.exitcode < 0:
        try:
            how = f"signal {signal.Signals(-failure.exitcode).name}"
        except ValueError:
            how = f"signal {-failure.exitcode}"
    more = f"; {others} other worker(s) ended with it" if others else ""
    first = " first" if others else ""
    return (f"rank {rank} (local rank {failure.local_rank}, pid {failure.pid}) failed{first} with {how}"
            f"{_reported(failure)}{more}\n{_last_lines(rank, failure)}"
            "HINT: that rank's own output above says why; `--max-restarts K` lets torchrun's agent restart "
            "the workers after a failure")


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
    recorded one (torch's own choice compares whole seconds, and then takes the lowest rank), else the
    failure's own timestamp; a worker with no record (killed by the agent after another failed) is last."""
    def when(rank: int):
        ns = _extra(failures[rank]).get("exatrain_time_ns")
        return (0, ns, rank) if isinstance(ns, int) else (1, failures[rank].timestamp, rank)
    rank = min(failures, key=when)
    return rank, failures[rank]


def main(argv: list[str] | None = None) -> int:
    """Run the workers to completion; 0, or the first failed worker's exit code."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(sys.argv[1:] if argv is None else argv))
    except SignalException as e:  # a --signals-to-handle signal: the agent passed it to the workers and stopped
        print(f"exatrain: the agent received {e.sigval.name} and passed it to the workers", file=sys.stderr, flush=True)
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        rank, failure = first_failure(e.failures)
        print(f"exatrain: error: {describe_failure(rank, failure, len(e.failures) - 1)}", file=sys.stderr, flush=True)
        return failure_exit_code(failure.exitcode)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
