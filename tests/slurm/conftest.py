"""A real SLURM cluster for the tests in tests/slurm.

The session-scoped ``slurm_cluster`` fixture starts ``testbed/up.sh`` once (one slurmctld and
N slurmd on this machine, fake GPUs, see testbed/README.md), hands out a :class:`SlurmCluster`
and runs ``testbed/down.sh`` at the end of the session, also when tests failed.

Needs root, ``unshare --uts`` and Debian's slurm-wlm packages (up.sh installs them with
apt-get when missing). Where that is impossible the tests are skipped, unless ``CI`` is
set (CI=true): there they fail, because CI must really run them.

Besides node1..nodeN (default partition ``debug``) the testbed has site-shaped nodes and partitions
(testbed/sites.conf: LUMI-G, JUWELS Booster, JURECA-DC, generic) for ``sbatch --test-only``; the LUMI-G,
JUWELS Booster, JURECA-DC and generic ones are site twins, each in a network namespace of its own with the
site's interfaces and host names (docs/sites/twins.md), where jobs run.

Environment knobs: STB_NODES / STB_CPUS / STB_GPUS / STB_MEM_MB / STB_CTLD_PORT /
STB_NODE_PORT0 / STB_SITES (default 1 here; passed on to up.sh), EXATRAIN_SLURM_TMP (parent of the state dir,
default /tmp), EXATRAIN_SLURM_KEEP=1 (keep the state dir and its logs even when all tests passed),
EXATRAIN_SLURM_LOCK_TIMEOUT (seconds to wait for another session's testbed, default 900).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import pytest

HERE = Path(__file__).resolve().parent
TESTBED = HERE / "testbed"
# One testbed per machine at a time (fixed ports, /etc/hosts block): sessions take turns.
LOCK_PATH = Path("/tmp/exatrain-slurm-testbed.lock")

# JobState values after which a job will not change any more by itself.
TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
        "TIMEOUT",
    }
)
# Variables of an enclosing allocation (pytest itself run inside a SLURM job) would leak
# into srun/sbatch here and point them at the wrong job or cluster.
# Rendezvous variables that in-process dist tests leave in this process (init_distributed exports them)
# would be exported by sbatch into the jobs and pick their master port: strip those too.
_FOREIGN_ENV = re.compile(
    r"^(SLURM_|SBATCH_|SRUN_|SALLOC_|SQUEUE_|SINFO_|SCONTROL_|SACCT_|TORCHELASTIC_|MASTER_ADDR$"
    r"|MASTER_PORT$|RANK$|WORLD_SIZE$|LOCAL_RANK$|LOCAL_WORLD_SIZE$|GROUP_RANK$)"
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test below tests/slurm gets the ``slurm`` marker (``-m 'not slurm'`` skips them)."""
    for item in items:
        if Path(str(item.path)).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.slurm)


def _on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes", "on"}


def _unavailable(reason: str) -> None:
    """Skip, or fail on CI, where this machine cannot run the testbed."""
    if _on_ci():
        pytest.fail(f"SLURM testbed unavailable on CI (CI={os.environ['CI']}): {reason}", pytrace=False)
    pytest.skip(f"SLURM testbed unavailable: {reason}")


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} unreadable)"


def _job_pids(job_id: str) -> list[int]:
    """The Python processes on this machine that run in SLURM job ``job_id`` (SLURM_JOB_ID in their
    environment)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if f"SLURM_JOB_ID={job_id}".encode() in environ and b"python" in cmdline:
            pids.append(int(proc.name))
    return sorted(pids)


def _py_spy(pid: int) -> str:
    """py-spy's dump of a process's Python threads (installed with the test extra), or why there is none."""
    spy = Path(sys.executable).parent / "py-spy"
    try:
        done = subprocess.run(
            [str(spy), "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(no dump: {e})"
    return done.stdout + done.stderr


class SlurmCluster:
    """Handle on the running testbed. All commands run with :attr:`env` (SLURM_CONF set)."""

    def __init__(
        self,
        state_dir: Path,
        nodes: list[str],
        gpus_per_node: int,
        cpus_per_node: int,
        site_nodes: list[str] | None = None,
    ):
        self.state_dir = state_dir
        self.site_nodes = site_nodes or []  # sites.conf's nodes (only in the site partitions)
        self.conf = state_dir / "etc" / "slurm.conf"
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.cpus_per_node = cpus_per_node
        env = {k: v for k, v in os.environ.items() if not _FOREIGN_ENV.match(k)}
        env["SLURM_CONF"] = str(self.conf)
        self.env: dict[str, str] = env

    def __repr__(self) -> str:
        return f"SlurmCluster(nodes={self.nodes}, conf={self.conf})"

    def run(
        self,
        cmd: Sequence[str | os.PathLike],
        *,
        check: bool = False,
        timeout: float = 120,
        cwd: str | os.PathLike | None = None,
        env: dict[str, str] | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess:
        """Run ``cmd`` (text mode, output captured) with the cluster's env plus ``env``."""
        full_env = dict(self.env, **(env or {}))
        return subprocess.run(
            [str(c) for c in cmd],
            env=full_env,
            cwd=cwd,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
        )

    def sbatch(
        self,
        script_path: str | os.PathLike,
        *args: str,
        cwd: str | os.PathLike | None = None,
        script_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> str:
        """``sbatch --parsable *args script_path *script_args``; returns the job id (a str).

        ``args`` are sbatch options. ``cwd`` (default: the script's directory) becomes the
        job's working dir and $SLURM_SUBMIT_DIR. The job runs a *copy* of the script from the
        slurmd spool dir, so scripts must locate their files via $SLURM_SUBMIT_DIR, not $0.
        """
        script = Path(script_path).resolve()
        cwd = Path(cwd) if cwd is not None else script.parent
        proc = self.run(["sbatch", "--parsable", *args, script, *script_args], cwd=cwd, env=env)
        if proc.returncode != 0:
            raise RuntimeError(
                f"sbatch {' '.join(args)} {script} failed ({proc.returncode}): {proc.stderr.strip()}"
            )
        return proc.stdout.strip().split(";")[0]

    def job_info(self, job_id: str | int | None = None) -> list[dict[str, str]]:
        """``scontrol show job -o`` parsed into one dict per record (array tasks: several; no job id: every
        job SLURM knows)."""
        proc = self.run(
            ["scontrol", "show", "job", "-o", *([] if job_id is None else [str(job_id)])], timeout=30
        )
        if proc.returncode != 0:
            return []
        records = []
        for line in proc.stdout.splitlines():
            if line.strip():
                # a value may hold spaces (a run directory's StdOut, a job name): a field starts only at a
                # space followed by Key=
                fields = re.split(r" (?=[A-Za-z][\w/:.-]*=)", line.strip())
                records.append(dict(kv.split("=", 1) for kv in fields if "=" in kv))
        return records

    def state(self, job_id: str | int) -> str:
        """Current JobState, e.g. PENDING/RUNNING/COMPLETED ("UNKNOWN" if SLURM forgot it).

        For a job array with tasks in different states: the states, sorted, joined by ",".
        """
        states = sorted({r.get("JobState", "UNKNOWN") for r in self.job_info(job_id)})
        return ",".join(states) if states else "UNKNOWN"

    def wait(self, job_id: str | int, timeout: float = 300) -> str:
        """Poll every 0.5 s until the job (every array task) reached a final state; return it."""
        deadline = time.monotonic() + timeout
        state = "UNKNOWN"
        while True:
            state = self.state(job_id)
            if state != "UNKNOWN" and all(s in TERMINAL_STATES for s in state.split(",")):
                return state
            if time.monotonic() > deadline:
                report = self.stuck_report(job_id)  # before scancel: the stacks of the ranks still running
                self.run(
                    ["scancel", str(job_id)], timeout=30
                )  # a stuck job must not hold nodes for later tests
                raise TimeoutError(
                    f"job {job_id} still {state} after {timeout} s\n"
                    f"{self.run(['squeue'], timeout=30).stdout}\n{report}\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def stuck_report(self, job_id: str | int) -> str:
        """For a job that did not finish: each unfinished task's output tail and the Python stacks (py-spy) of
        its processes, so that a hang seen once in CI can be diagnosed from the CI log alone."""
        parts = []
        for record in self.job_info(job_id):
            if record.get("JobState") in TERMINAL_STATES:
                continue
            task = record.get("JobId", "?")
            parts.append(
                f"--- job {task} output ({record.get('StdOut')})\n{_tail(Path(record.get('StdOut', '-')))}"
            )
            parts.extend(
                f"--- py-spy dump of pid {pid} (job {task})\n{_py_spy(pid)}" for pid in _job_pids(task)
            )
        return "\n".join(parts)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of every daemon log, for assertion messages."""
        return "\n".join(
            f"--- {log}\n{_tail(log, lines)}" for log in sorted((self.state_dir / "log").glob("*.log"))
        )


def _take_lock(timeout: float):
    LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
    fh = open(LOCK_PATH, "a+")
    deadline = time.monotonic() + timeout
    announced = False
    while True:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fh.seek(0)
            fh.truncate()
            fh.write(f"{os.getpid()}\n")
            fh.flush()
            return fh
        except BlockingIOError:
            if time.monotonic() > deadline:
                fh.seek(0)
                holder = fh.read().strip() or "?"
                fh.close()
                _unavailable(f"another pytest session (pid {holder}) held {LOCK_PATH} for {timeout:.0f} s")
            if not announced:
                print(f"\nwaiting for another session's SLURM testbed ({LOCK_PATH})", file=sys.stderr)
                announced = True
            time.sleep(1)


@pytest.fixture(scope="session")
def slurm_cluster(request: pytest.FixtureRequest):
    if not sys.platform.startswith("linux"):
        _unavailable(f"needs Linux, not {sys.platform}")
    if os.geteuid() != 0:
        _unavailable("needs root (starts slurmctld/slurmd/munged, edits /etc/hosts)")
    if shutil.which("unshare") is None:
        _unavailable("`unshare` (util-linux) not found")

    lock = _take_lock(float(os.environ.get("EXATRAIN_SLURM_LOCK_TIMEOUT", "900")))
    base = Path(tempfile.mkdtemp(prefix="exatrain-slurm-", dir=os.environ.get("EXATRAIN_SLURM_TMP", "/tmp")))
    base.chmod(0o755)  # slurmctld runs as user slurm and must reach its spool/log dirs
    state = base / "state"
    env = {k: v for k, v in os.environ.items() if not _FOREIGN_ENV.match(k)}
    env.update(STB_STATE=str(state), STB_REPLACE="1")  # we hold the lock: any other testbed is stale
    env.setdefault("STB_SITES", "1")
    env.setdefault("STB_ACCOUNTING", "1")  # slurmdbd: sacct works, QOS names are checked (test_sbatch_hints)
    up_log, down_log = base / "up.log", base / "down.log"
    started = False
    keep_reason: str | None = "the testbed did not start"

    def down() -> None:
        with open(down_log, "w") as out:
            proc = subprocess.run(
                ["bash", str(TESTBED / "down.sh")],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=120,
            )
        if proc.returncode != 0:
            print(f"\nSLURM testbed: down.sh exited {proc.returncode}:\n{_tail(down_log)}", file=sys.stderr)

    try:
        t0 = time.monotonic()
        # Output goes to a file, not a pipe, and the daemons detach (setsid, stdio on
        # /dev/null): nothing here waits for them.
        with open(up_log, "w") as out:
            started = True
            try:
                proc = subprocess.run(
                    ["bash", str(TESTBED / "up.sh")],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=900,
                    start_new_session=True,
                )
            except subprocess.TimeoutExpired:
                pytest.fail(f"testbed/up.sh timed out:\n{_tail(up_log)}", pytrace=False)
        if proc.returncode == 2:
            keep_reason = None
            _unavailable(_tail(up_log, 5))
        if proc.returncode != 0:
            pytest.fail(f"testbed/up.sh failed ({proc.returncode}):\n{_tail(up_log)}", pytrace=False)

        nodes = [f"node{i}" for i in range(1, int((state / "run" / "nodes").read_text()) + 1)]
        gpus = int((state / "run" / "gpus").read_text())
        cpus = int((state / "run" / "cpus").read_text())
        sites = (state / "run" / "site_nodes").read_text().split()
        cluster = SlurmCluster(state, nodes, gpus, cpus, sites)
        print(f"\nSLURM testbed up in {time.monotonic() - t0:.1f} s: {cluster}", file=sys.stderr)
        yield cluster
        keep_reason = "tests failed" if request.session.testsfailed else None
    finally:
        try:
            if started:
                down()
        finally:
            lock.close()  # releases the flock
        if keep_reason or os.environ.get("EXATRAIN_SLURM_KEEP") == "1":
            print(
                f"\nSLURM testbed state and logs kept in {base} ({keep_reason or 'EXATRAIN_SLURM_KEEP=1'})",
                file=sys.stderr,
            )
        else:
            shutil.rmtree(base, ignore_errors=True)
