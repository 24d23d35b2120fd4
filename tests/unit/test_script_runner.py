"""exatrain.launch.script_runner: a script started through it behaves as under plain `python` (checked against
a real `python` run of the same script), and what the script leaves behind is freed before the interpreter
starts finalizing (the difference that keeps gloo's threads from aborting the process at exit)."""

import subprocess
import sys

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
