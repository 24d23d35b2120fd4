"""Shared helpers: run the real `exatrain` command line in a subprocess, find and kill its workers."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import run_scan
from tests.run_scan import pytest_sessionfinish, pytest_testnodedown  # noqa: F401 (hooks: the whole-run scan)

ROOT = Path(__file__).resolve().parents[1]


def clean_environment(env=None) -> dict:
    """This process's environment without launcher variables (so the CLI starts its own workers), plus
    `env`."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "TORCHELASTIC_", "OMPI_", "PMI_", "MASTER_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")
    }
    base.update(env or {})
    return base


def run_exatrain(args, cwd, timeout=600, env=None, wrap=()):
    """Run `python -m exatrain.cli.main ARGS` with a clean environment (no inherited launcher variables),
    optionally under a wrapper command such as `taskset -c 1`. `exatrain run`'s output goes to the whole
    run's scan (tests/run_scan.py)."""
    done = subprocess.run(
        [*wrap, sys.executable, "-m", "exatrain.cli.main", *args],
        cwd=cwd,
        env=clean_environment(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    run_scan.record(list(args), done.stdout, done.stderr)
    return done


@contextlib.contextmanager
def started_exatrain(args, cwd, env=None):
    """`python -m exatrain.cli.main ARGS` running in the background in a session of its own; whatever of it is
    still running at the end (agent, workers) is killed. Output goes to files (a pipe nobody reads could fill
    up and block the workers); `finish(proc)` waits and returns (exit code, stdout, stderr)."""
    out, err = Path(cwd) / f"exatrain-{os.getpid()}.out", Path(cwd) / f"exatrain-{os.getpid()}.err"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "exatrain.cli.main", *args],
            cwd=cwd,
            env=clean_environment(env),
            stdout=o,
            stderr=e,
            text=True,
            start_new_session=True,
        )
    proc.out_path, proc.err_path, proc.exatrain_args = out, err, list(args)
    try:
        yield proc
    finally:
        # SIGTERM first: torchrun's agent then stops its workers, which run in sessions of their own and
        # would outlive a SIGKILL of this group (a hung rank would keep running after the test)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    """Wait for a run started by `started_exatrain`; its exit code, stdout and stderr (`exatrain run`'s also
    to the whole run's scan, tests/run_scan.py)."""
    proc.wait(timeout=timeout)
    out, err = proc.out_path.read_text(), proc.err_path.read_text()
    run_scan.record(getattr(proc, "exatrain_args", []), out, err)
    return proc.returncode, out, err


def wait_for(condition, timeout: float, what: str, proc: subprocess.Popen | None = None):
    """Poll `condition()` every 20 ms until it returns something true; fail (and stop `proc`) after
    `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        if proc is not None and proc.poll() is not None:
            code, out, err = finish(proc)
            pytest.fail(f"the run ended (exit code {code}) before {what}:\n{out}\n{err}")
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def descendants(pid: int) -> list[int]:
    """All processes below `pid` (children, grandchildren, ...), read from /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue  # not a process, or it just ended
        # the command name in parentheses may hold spaces: the parent pid is the 2nd field after it
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def worker_pid(launcher_pid: int, rank: int) -> int | None:
    """The pid of the torchrun worker with global rank `rank` below `launcher_pid` (RANK in its
    environment)."""
    for pid in descendants(launcher_pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"TORCHELASTIC_RUN_ID" in b"".join(environ) and f"RANK={rank}".encode() in environ:
            return pid
    return None


def xdist_scope(nodeid: str) -> str:
    """The unit of work a pytest-xdist worker takes whole: the test's file, or all of tests/slurm."""
    path = nodeid.split("::", 1)[0]
    return "tests/slurm" if path.startswith("tests/slurm/") else path


def pytest_xdist_make_scheduler(config, log):
    """scripts/test.sh runs two pytest-xdist workers. Each file runs in one worker, in order, so a module
    fixture (a shared reference run) is computed once; every SLURM test runs in one worker, so only one test
    cluster is started (a second worker's cluster would wait for the first's lock until that worker ends).

    `pytest_xdist_make_scheduler` is xdist's public hook (xdist/newhooks.py). What it returns subclasses
    xdist's exported `LoadScopeScheduling` and overrides its `_split_scope`, the method xdist's own
    `LoadFileScheduling` and `LoadGroupScheduling` override; no public option does the same (checked with
    pytest 9.2.0 and pytest-xdist 3.8.0; tests/unit/test_xdist_scheduler.py fails when that changes):
    - `--dist loadfile` keeps each file in one worker but spreads tests/slurm's files over both workers,
      each starting its own test cluster (the second waits for the first's lock until that worker ends);
    - `--dist loadgroup` with an `xdist_group` mark on tests/slurm is a no-op under pytest 9.2: xdist appends
      the group to `item._nodeid`, while pytest 9.2's `Item.nodeid` reads `item._id`, so every test stays
      its own group; and unmarked tests would be spread test by test, not file by file;
    - writing a scheduler against xdist's public `Scheduling` protocol would copy LoadScopeScheduling's
      ~400 lines of work distribution."""
    from xdist.scheduler import LoadScopeScheduling

    class FileOrSlurmScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return FileOrSlurmScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` run where torch sees a CUDA GPU; elsewhere each is skipped with the reason, which
    `-ra` (pyproject's addopts) prints in the summary, so a CPU-only run says what it did not test."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(
        reason=f"gpu: needs a CUDA GPU, and torch {torch.__version__} sees none on this machine "
        "(run tests/gpu on a GPU node)"
    )
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(autouse=True)
def _restore_environment():
    """Each test leaves os.environ as it found it. In-process tests run exatrain.init, which exports RANK,
    LOCAL_RANK, WORLD_SIZE and MASTER_* as torchrun would; left set, they reach the next test of the same
    pytest worker (a leaked LOCAL_RANK once made tests/e2e/test_agent_exit_barrier.py's agents look like
    workers). Fixtures of a wider scope set up before this snapshot, so what they export stays."""
    saved = dict(os.environ)
    yield
    if dict(os.environ) != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
def exatrain_cli(tmp_path):
    """Call the CLI with cwd=tmp_path; returns CompletedProcess."""
    return lambda *args, **kw: run_exatrain(list(args), kw.pop("cwd", tmp_path), **kw)
