"""How exatrain starts a user's Python script in each rank: ``python -m exatrain.launch.script_runner SCRIPT.py
ARGS`` (or ``-m MODULE ARGS``) runs it exactly as ``python SCRIPT.py ARGS`` would (``__main__``, ``sys.argv``,
``sys.path[0]``, exit code), and then releases what the script left behind while Python is still fully alive.

Why: torch 2.13's gloo worker threads drop the tensors of a finished collective after the caller has moved on,
and dropping a tensor that Python also saw takes the GIL. A process group kept alive past
``destroy_process_group()`` (a DDP model holds one, and models sit in reference cycles or module globals until
the interpreter is torn down) still has those threads at exit; if one of them reaches for the GIL while Python
finalizes, CPython ends that thread from inside a C++ destructor and the process aborts ("terminate called
without an active exception", SIGABRT), failing a job whose training finished (pytorch/pytorch#190489). Running
the script with `runpy` leaves its globals as garbage when it returns; a garbage collection in an exit handler,
registered before the script runs so it runs after the script's own, frees models and process groups while
the interpreter can still serve those threads (the process group's destructor waits for them without the GIL).

Never imports torch.
"""

from __future__ import annotations

import atexit
import gc
import os
import runpy
import sys

_USAGE = "usage: python -m exatrain.launch.script_runner SCRIPT.py [ARGS...] | -m MODULE [ARGS...]"


def _release_leftovers() -> None:
    """Collect what the script left (its globals, reference cycles) before the interpreter finalizes."""
    gc.collect()


def run(argv: list[str]) -> None:
    """Run ``SCRIPT ARGS`` or ``-m MODULE ARGS`` as ``__main__``, as the interpreter itself would."""
    if not argv or argv[0] == "-m" and len(argv) < 2:
        raise SystemExit(_USAGE)
    atexit.register(_release_leftovers)
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]  # run_module puts the module's file name in argv[0], as python -m does
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
    that was the script's module, which would keep all its globals alive until Python finalizes."""
    if "__mp_main__" in sys.modules:
        sys.modules["__mp_main__"] = sys.modules["__main__"]


def _is_runner_frame(filename: str) -> bool:
    return filename == __file__ or filename == runpy.__file__ or filename == "<frozen runpy>"


def main() -> None:
    """Run the target; an uncaught exception is printed as python prints it (without this module's and
    runpy's frames) and exits 1, and its traceback is dropped so the script's objects can still be freed."""
    try:
        run(sys.argv[1:])
    except Exception as e:
        tb = e.__traceback__
        while tb is not None and _is_runner_frame(tb.tb_frame.f_code.co_filename):
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)
        e.__traceback__ = tb = None
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
