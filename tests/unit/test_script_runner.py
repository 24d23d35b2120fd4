"""exatrain.launch.script_runner: a script started through it behaves as under plain `python` (checked against
a real `python` run of the same script: output, exit status, exit handlers, threads, files left open), what
it leaves behind is freed while the interpreter is whole, and the interpreter never starts finalizing (the
difference that keeps gloo's threads from aborting the process at exit)."""

import os
import signal
import subprocess
import sys

from tests.conftest import clean_environment

RUNNER = [sys.executable, "-m", "exatrain.launch.script_runner"]

SHOW = """import os, sys
print(__name__, os.path.basename(sys.argv[0]), sys.argv[1:], sys.path[0], __file__, os.getcwd())
sys.exit(int(sys.argv[1]))
"""

RAISE = """def inner():
    raise ValueError("boom")


inner()
"""

# An object in a reference cycle, as a DDP model usually is: its finalizer records whether Python was already
# finalizing when it ran (plain python frees such garbage only in its final collection, during finalization).
# multiprocessing, which torch imports, keeps the main module (and so its globals) as __mp_main__.
CYCLE = """import multiprocessing, sys


class Model:
    def __del__(self):
        print("freed while finalizing:", sys.is_finalizing(), flush=True)


model = Model()
model.self = model
"""


def _run(cmd, cwd):
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_a_script_sees_what_python_gives_it_and_its_exit_code_passes(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "show.py").write_text(SHOW)
    plain = _run([sys.executable, "sub/show.py", "3", "--x"], tmp_path)
    runner = _run([*RUNNER, "sub/show.py", "3", "--x"], tmp_path)
    assert plain.returncode == runner.returncode == 3
    assert runner.stdout == plain.stdout and f"{tmp_path}/sub" in plain.stdout, (plain.stdout, runner.stdout)


def test_argv0_is_the_scripts_absolute_path(tmp_path):
    """The one documented difference from plain python, which keeps argv[0] as given."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "argv0.py").write_text("import sys\nprint(sys.argv[0])\n")
    runner = _run([*RUNNER, "sub/argv0.py"], tmp_path)
    assert runner.stdout.strip() == str(tmp_path / "sub" / "argv0.py")


def test_a_module_runs_as_under_python_dash_m(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "show.py").write_text(SHOW)
    plain = _run([sys.executable, "-m", "pkg.show", "4"], tmp_path)
    runner = _run([*RUNNER, "-m", "pkg.show", "4"], tmp_path)
    assert plain.returncode == runner.returncode == 4
    assert runner.stdout == plain.stdout, (plain.stdout, runner.stdout)


def test_an_uncaught_exception_prints_as_under_python_and_exits_1(tmp_path):
    (tmp_path / "bad.py").write_text(RAISE)
    plain = _run([sys.executable, "bad.py"], tmp_path)
    runner = _run([*RUNNER, "bad.py"], tmp_path)
    assert plain.returncode == runner.returncode == 1
    assert runner.stderr == plain.stderr, runner.stderr  # no runner or runpy frames in the traceback


def test_what_the_script_left_is_freed_before_python_finalizes(tmp_path):
    (tmp_path / "cycle.py").write_text(CYCLE)
    plain = _run([sys.executable, "cycle.py"], tmp_path)
    runner = _run([*RUNNER, "cycle.py"], tmp_path)
    assert plain.stdout.strip() == "freed while finalizing: True"  # the case the runner exists for
    assert runner.stdout.strip() == "freed while finalizing: False"
    assert runner.returncode == 0


# Python's order at exit: the main thread's end, then non-daemon threads are waited for, then exit handlers
# run last-registered first. A file written through a buffer and never closed, held by another module.
ENDING = """import atexit, sys, threading, time
import leftover


def late():
    time.sleep(0.3)
    print("thread done", flush=True)


threading.Thread(target=late).start()
atexit.register(print, "registered first")
atexit.register(print, "registered second")
leftover.log = open(sys.argv[1], "w")
leftover.log.write("written, never closed")
print("end of script")
"""


def test_threads_exit_handlers_and_files_left_open_end_as_under_python(tmp_path):
    (tmp_path / "leftover.py").write_text("log = None\n")
    (tmp_path / "ending.py").write_text(ENDING)
    plain = _run([sys.executable, "ending.py", "plain.txt"], tmp_path)
    runner = _run([*RUNNER, "ending.py", "runner.txt"], tmp_path)
    order = ["end of script", "thread done", "registered second", "registered first"]
    assert plain.stdout.splitlines() == order, plain.stdout
    assert runner.stdout.splitlines() == order, runner.stdout
    assert (
        (tmp_path / "runner.txt").read_text()
        == (tmp_path / "plain.txt").read_text()
        == "written, never closed"
    )
    assert plain.returncode == runner.returncode == 0


def test_sys_exit_with_a_message_prints_it_and_exits_1_as_under_python(tmp_path):
    (tmp_path / "msg.py").write_text("import sys\nsys.exit('no data in ./data: pass --data')\n")
    plain = _run([sys.executable, "msg.py"], tmp_path)
    runner = _run([*RUNNER, "msg.py"], tmp_path)
    assert plain.returncode == runner.returncode == 1
    assert runner.stderr == plain.stderr == "no data in ./data: pass --data\n"


def test_an_uncaught_keyboard_interrupt_ends_by_sigint_as_under_python(tmp_path):
    (tmp_path / "ctrl_c.py").write_text("raise KeyboardInterrupt\n")
    plain = _run([sys.executable, "ctrl_c.py"], tmp_path)
    runner = _run([*RUNNER, "ctrl_c.py"], tmp_path)
    assert plain.returncode == runner.returncode == -signal.SIGINT
    assert runner.stderr == plain.stderr and "KeyboardInterrupt" in runner.stderr


# An object another module still references at exit: python finalizes it during interpreter shutdown (where a
# gloo thread reaching for the GIL aborts the process); the runner never starts that shutdown.
HELD = """import sys
import holder


class Model:
    def __del__(self):
        print("freed while finalizing:", sys.is_finalizing(), flush=True)


holder.model = Model()
"""


def test_the_interpreter_never_starts_finalizing(tmp_path):
    """The documented difference from plain python: objects still referenced at exit are not finalized."""
    (tmp_path / "holder.py").write_text("model = None\n")
    (tmp_path / "held.py").write_text(HELD)
    plain = _run([sys.executable, "held.py"], tmp_path)
    runner = _run([*RUNNER, "held.py"], tmp_path)
    assert plain.stdout.strip() == "freed while finalizing: True"
    assert runner.stdout == "" and runner.returncode == 0


def test_mask_option_outside_torchrun_binds_nothing_says_why_and_imports_no_torch(tmp_path):
    """The runner's own option is taken off the script's arguments; outside torchrun there is no worker to
    bind, which is said on one line; the runner imported no torch before the script started."""
    (tmp_path / "cores.py").write_text(
        "import os, sys\nprint(sorted(os.sched_getaffinity(0)), sys.argv[1:], 'torch' in sys.modules)\n"
    )
    r = subprocess.run(
        [*RUNNER, "--cpu-masks=0x1", "cores.py", "a"],
        cwd=tmp_path,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{sorted(os.sched_getaffinity(0))} ['a'] False"
    assert (
        r.stderr == "exatrain: not bound to a CPU mask: it was not started by torchrun (launched by local)\n"
    )


def test_a_bad_mask_is_refused_with_a_hint(tmp_path):
    (tmp_path / "never.py").write_text("print('ran')\n")
    r = subprocess.run(
        [*RUNNER, "--gpu-cpu-masks=0xfe,fe00", "never.py"],
        cwd=tmp_path,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "ran" not in r.stdout
    assert "--gpu-cpu-masks=0xfe,fe00: 'fe00' is no CPU mask" in r.stderr and "HINT:" in r.stderr, r.stderr
