"""How exatrain starts a user's Python script in each rank: ``python -m exatrain.launch.script_runner
SCRIPT.py ARGS`` (or ``-m MODULE ARGS``) runs it as ``python SCRIPT.py ARGS`` would (``__main__``,
``sys.argv``, ``sys.path[0]``, exit code, traceback) and then ends the process without the interpreter's
finalization.

Why: torch 2.13's gloo worker threads drop the tensors of a finished collective after the caller has moved on,
and dropping a tensor that Python also saw takes the GIL. A process group kept alive past
``destroy_process_group()`` (a DDP model holds one, and models sit in reference cycles or module globals until
the interpreter is torn down) still has those threads at exit; if one of them reaches for the GIL once Python
has started finalizing, CPython ends that thread from inside a C++ destructor and the process aborts
("terminate called without an active exception", SIGABRT), failing a job whose training finished
(pytorch/pytorch#190489). Freeing the script's garbage first only narrows that race (whatever still holds a
process group keeps its threads running), so the runner never lets finalization start: it does what Python
does before finalizing (joins non-daemon threads, runs atexit handlers), frees the script's garbage, flushes
every open file, and leaves with ``os._exit`` as multiprocessing's child processes do. The one difference a
script can see: objects still referenced at exit (from another module's globals, say) are not finalized.

Every line the script writes to stdout or stderr goes out whole (`launch.lines`: torchrun's ``python -u``
would write each ``print`` argument on its own, mixing ranks' lines); the option ``--label`` (first) begins
each line with ``[rank N] ``. A failed script's message and last lines go to torchrun's error file for the
agent.

Options before the script (never seen by it): ``--label``, then ``--gpu-cpu-masks=M0,M1,...`` binds a torchrun
worker to the mask of the node's GPU behind its local rank, ``--cpu-masks=M0,M1,...`` to the mask of its local
rank (CPU nodes), before the script allocates anything (`env.affinity.bind_worker`, as exatrain.init does).
The torchrun mode of `exatrain submit` passes the job's masks (`launch.binding`): its one task per node holds
all the node's cores, so srun cannot bind per GPU. A worker that cannot be bound says why, on one line.

Never imports torch.
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import re
import runpy
import signal
import sys

from exatrain.launch import lines, stack_dump
from exatrain.slurm.rank_command import LABEL_OPTION, MASK_OPTIONS

_USAGE = (
    "usage: python -m exatrain.launch.script_runner [--gpu-cpu-masks=M,... | --cpu-masks=M,...] "
    "SCRIPT.py [ARGS...] | -m MODULE [ARGS...]"
)
_HEX = re.compile(r"0[xX][0-9a-fA-F]+")


def parse_options(argv: list[str]) -> tuple[tuple[str, ...], bool, list[str]]:
    """Split the runner's own mask option off ``argv``: (masks, whether per GPU, the target's words)."""
    masks: tuple[str, ...] = ()
    per_gpu = False
    while argv and argv[0].split("=", 1)[0] in MASK_OPTIONS:
        option, _, value = argv[0].partition("=")
        masks, per_gpu, argv = tuple(value.split(",")), MASK_OPTIONS[option], argv[1:]
        bad = [m for m in masks if not _HEX.fullmatch(m)]
        if bad:
            raise SystemExit(
                f"exatrain.launch.script_runner: {option}={value}: {bad[0]!r} is no CPU mask\n"
                "HINT: give hexadecimal masks separated by commas, e.g. --cpu-masks=0x1,0x2"
            )
    return masks, per_gpu, argv


def bind(masks: tuple[str, ...], per_gpu: bool) -> None:
    """Bind this torchrun worker to its mask; print one line when it cannot be bound (why)."""
    from exatrain.env import (
        detect_environment,  # imported only here: without masks the runner imports nothing more
    )
    from exatrain.env.affinity import bind_worker
    from exatrain.errors import ClusterEnvError

    try:
        env = detect_environment()
    except ClusterEnvError as e:
        return _not_bound(f"its environment is inconsistent: {e.message}")
    if env.kind != "torchelastic":
        return _not_bound(f"it was not started by torchrun (launched by {env.kind})")
    result = bind_worker(masks, env.local_rank, per_gpu)
    if not result.bound:
        print(f"exatrain: {result.note}", file=sys.stderr, flush=True)


def refuse_spawning_in_shared_store(target: list[str]) -> None:
    """Exit with an error (and a HINT) when the script starts its own processes inside a torchrun worker whose
    agent shares its store: they would wait in that store for a group that never forms (`launch.peers`)."""
    from exatrain.launch.peers import parse_script, shared_store_error, spawn_line

    line = spawn_line(parse_script(target[0])) if target and target[0] != "-m" else None
    if not line:
        return
    from exatrain.env import detect_environment
    from exatrain.errors import ClusterEnvError

    try:
        env = detect_environment()
    except ClusterEnvError:
        return  # the script's own init reports it
    if env.kind == "torchelastic" and env.launcher_hosts_store:
        raise SystemExit(f"exatrain: error: {shared_store_error(target[0], line)}")


def _not_bound(why: str) -> None:
    print(f"exatrain: not bound to a CPU mask: {why}", file=sys.stderr, flush=True)


def run(argv: list[str]) -> None:
    """Run ``SCRIPT ARGS`` or ``-m MODULE ARGS`` as ``__main__``, as the interpreter itself would."""
    if not argv or argv[0] == "-m" and len(argv) < 2:
        raise SystemExit(_USAGE)
    try:
        if argv[0] == "-m":
            sys.argv = [
                argv[1],
                *argv[2:],
            ]  # run_module puts the module's file name in argv[0], as python -m does
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            path = os.path.abspath(argv[0])  # python SCRIPT names it so in __file__ and tracebacks
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(path)  # and puts its folder first, not the cwd
            runpy.run_path(path, run_name="__main__")
    finally:
        _forget_script_module()


def _forget_script_module() -> None:
    """Importing multiprocessing (torch does) aliases ``__main__`` as ``__mp_main__``: while the script ran,
    that was the script's module, which would keep all its globals alive."""
    if "__mp_main__" in sys.modules:
        sys.modules["__mp_main__"] = sys.modules["__main__"]


def _is_runner_frame(filename: str) -> bool:
    return filename == __file__ or filename == runpy.__file__ or filename == "<frozen runpy>"


def _exit_code(e: SystemExit) -> int:
    """The status python gives ``sys.exit(code)``: None is 0, an int is itself, anything else is printed and
    1."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def _print_uncaught(e: BaseException) -> None:
    """Print an uncaught exception as python does, without this module's and runpy's frames, then drop the
    traceback so the objects its frames held can be freed."""
    tb = e.__traceback__
    while tb is not None and _is_runner_frame(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    sys.excepthook(type(e), e.with_traceback(tb), tb)
    e.__traceback__ = tb = None


def _flush_open_files() -> None:
    """Write out what files the script left open still buffer (python's finalization would close them).

    The test is on ``type(obj)``: ``isinstance`` reads ``obj.__class__``, which runs the attribute hooks of
    whatever the script left alive (torch's deprecated ``torch.distributed.reduce_op`` warns when touched).
    """
    for obj in gc.get_objects():
        if issubclass(type(obj), io.IOBase):
            try:
                if not obj.closed:
                    obj.flush()
            except (OSError, ValueError):
                pass  # a broken pipe or a detached buffer: python's own close would fail the same way


def _leave(code: int, interrupted: bool = False, report=lambda: None) -> None:
    """End the process as python would after the script, minus finalization (see the module docstring);
    ``report`` runs once the output is flushed."""
    threading = sys.modules.get("threading")
    if threading is not None:
        threading._shutdown()  # wait for non-daemon threads, as Py_FinalizeEx does first
    # the script's (and torch's, logging's, multiprocessing's) exit handlers, in order
    atexit._run_exitfuncs()
    gc.collect()  # free the script's models and process groups while the interpreter is whole
    _flush_open_files()
    report()
    if interrupted:  # python ends by SIGINT after an uncaught KeyboardInterrupt, so the shell sees it
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)  # exit() keeps the low byte of the status too


def label_option(argv: list[str]) -> tuple[str, list[str]]:
    """Split ``--label`` off ``argv``: the prefix of this rank's lines (``[rank N] ``, N from RANK) or ""."""
    if argv[:1] != [LABEL_OPTION]:
        return "", argv
    from exatrain.env.torchelastic import rank_label

    return rank_label(), argv[1:]


def main() -> None:
    """Run the target and leave with its exit status; an uncaught exception is printed as python prints it
    and exits 1; an uncaught KeyboardInterrupt ends the process by SIGINT, as under python. Its output goes
    out in whole lines (`launch.lines`); a failure is recorded for torchrun's agent."""
    interrupted, failure = False, None
    label, argv = label_option(sys.argv[1:])
    tail = lines.install(label)
    masks, per_gpu, target = parse_options(argv)
    if masks:
        bind(masks, per_gpu)
    refuse_spawning_in_shared_store(target)
    hang = stack_dump.install()  # under `exatrain run`: stacks on SIGUSR1 (docs/hangs.md)
    try:
        run(target)
        code = 0
    except SystemExit as e:
        code = _exit_code(e)
    except KeyboardInterrupt as e:
        _print_uncaught(e)
        code, interrupted, failure = 128 + signal.SIGINT, True, "KeyboardInterrupt"
    except Exception as e:  # the script's own error, reported as python reports it
        if hang is not None and stack_dump.is_collective_timeout(e):  # one diagnosis, not N tracebacks
            code, failure = stack_dump.on_collective_timeout(e, hang), f"collective timeout: {e}"
        else:
            _print_uncaught(e)
            code, failure = 1, f"{type(e).__name__}: {e}"
    _leave(code, interrupted, lambda: code and _record(failure or f"exit code {code}", tail))


def _record(message: str, tail) -> None:
    from exatrain.env.torchelastic import worker_error_file

    lines.record_failure(message, tail, worker_error_file())


if __name__ == "__main__":
    main()
