"""The hang watcher and the collective-timeout diagnosis (docs/hangs.md) under real Open MPI: `mpirun -n 4`
(oversubscribed; invoked as tests/e2e/test_mpi.py does) starting `exatrain run` in every rank.

- hang_loop.py (test_hangs.py's user loop) with `--hang-timeout 10`, rank 2 sleeping at step 7: the same
  diagnosis as under `exatrain run --nproc 4` (test_hangs.check_rank_2_named), printed once, and mpirun
  ends with the ranks' exit code 76 and names it;
- the same over two "nodes" (`--map-by node`, test_mpi.py's stand-in for ssh: each node's daemon in its own
  UTS namespace, on this machine): rank 2, on the first node, is named with that node's host name, which
  the diagnosis and RUN_DIR/hang/exclude give as the suspect node;
- plain_hang.py (test_stack_dump.py's unmodified script) with an 8 s collective timeout, rank 1 sleeping
  at step 3: exit code 76, one diagnosis naming rank 1 and its line, ranks 0,2,3 in all_reduce, and no
  traceback on the terminal.

Open MPI stops the remaining ranks (SIGTERM, then SIGKILL) about a second after the first one exits
non-zero, so the rank that writes the diagnosis must print it before the others may leave: both paths
print first and then write the attempt's diagnosis.txt, which the other ranks wait for. The three runs start
together so that their waits overlap, each launcher with its own TMPDIR: Open MPI 4.1's mpiruns keep their
session directories under one TMPDIR, and one CI run of the three at once failed there (`ORTE_ERROR_LOG: File
exists in file util/session_dir.c`; open-mpi/ompi#8510 reports such failures of simultaneous small jobs).
"""

import shutil
import socket
import subprocess
import tempfile

import pytest

from exatrain.errors import EXIT_HANG
from tests.distributed.test_hangs import SCRIPT as HANG_LOOP
from tests.distributed.test_hangs import check_rank_2_named
from tests.distributed.test_stack_dump import SCRIPT as PLAIN_HANG
from tests.distributed.test_stack_dump import _line, check_names_rank_1
from tests.e2e.test_mpi import _outside_address, mpirun_command

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

#: what Open MPI 4.1's mpirun prints when a rank's non-zero exit ended the job
MPIRUN_SAYS = "mpirun detected that one or more processes exited with non-zero status"
#: the hang timeout: half of test_hangs.py's, so that the test stays within a minute on 2 cores
TIMEOUT_S = 10


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> (exit code of mpirun, stdout, stderr, run dir) of the three runs (None: not run)."""
    return start_hang_runs(tmp_path_factory.mktemp("mpi-hangs"), mpirun_command)


def start_hang_runs(tmp, command) -> dict:
    """The three runs (watched, nodes, plain) of 4 ranks started together by `command(tmp, words, master,
    nodes)` (an MPI launcher's command and environment), each in its run dir under `tmp`: name -> (exit
    code of the launcher, stdout, stderr, run dir), None where not run (no outside address for "nodes")."""
    watched = ["run", f"--hang-timeout={TIMEOUT_S}", str(HANG_LOOP), "sleep"]
    plain = ["run", "--hang-timeout=auto", str(PLAIN_HANG), "8", str(tmp / "m")]
    outside = _outside_address()  # a master address both "nodes" reach
    runs = {"watched": (watched, "127.0.0.1"), "nodes": (watched, outside), "plain": (plain, "127.0.0.1")}
    procs, scratch = {}, []
    for name, (words, master) in runs.items():
        if master is None:
            continue
        words = [*words[:2], f"--run-dir={tmp / name}", *words[2:]]
        cmd, env = command(tmp, words, master, nodes=name == "nodes")
        # short, so that the launcher's sockets under it stay within the 108 bytes of a socket path
        env = {**env, "TMPDIR": tempfile.mkdtemp(prefix=f"{name}-")}
        scratch.append(env["TMPDIR"])
        procs[name] = subprocess.Popen(
            cmd, cwd=tmp, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    results = dict.fromkeys(runs)
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=240)
            results[name] = (proc.returncode, out, err, tmp / name)
    finally:
        for proc in procs.values():
            proc.kill()
        for path in scratch:
            shutil.rmtree(path, ignore_errors=True)
    return results


def _mpirun_named_exit_76(err: str) -> None:
    assert MPIRUN_SAYS in err and f"Exit code:    {EXIT_HANG}\n" in err, err[-3000:]


def test_a_rank_sleeping_under_mpirun_is_named_with_its_line(runs):
    code, out, err, run_dir = runs["watched"]
    check_rank_2_named(
        code, out, err, run_dir, "sleep", TIMEOUT_S
    )  # mpirun's exit code: the first failed rank's
    _mpirun_named_exit_76(err)
    diagnosis = (run_dir / "hang" / "diagnosis.txt").read_text().strip()
    assert err.count(diagnosis) == 1, err[-4000:]  # the leader's, whole, once
    assert f"rank 2 ({socket.gethostname()}, pid " in diagnosis  # each rank's place from OMPI_COMM_WORLD_*


def test_over_two_nodes_the_stalled_ranks_node_is_the_suspect(runs):
    if runs["nodes"] is None:
        pytest.skip("no non-loopback address for a master that two nodes share")
    code, out, err, run_dir = runs["nodes"]
    # exatrain.init over several MPI nodes learns the node layout from the ranks' host names first: an
    # all_gather_object, 2 collectives, so the loop's 7th all_reduce is the group's 9th collective
    check_rank_2_named(code, out, err, run_dir, "sleep", TIMEOUT_S, collective=9)
    _mpirun_named_exit_76(err)
    diagnosis = (run_dir / "hang" / "diagnosis.txt").read_text().strip()
    assert "rank 2 (127.0.0.2, pid " in diagnosis  # --map-by node: ranks 0 and 2 on the first node
    assert diagnosis.endswith(
        "Suspect node(s): 127.0.0.2 (a SLURM job with job.hang_requeues is requeued without them)."
    )
    assert (run_dir / "hang" / "exclude").read_text() == "127.0.0.2\n"


def test_an_unmodified_scripts_collective_timeout_under_mpirun_gives_one_diagnosis(runs):
    code, out, err, run_dir = runs["plain"]
    assert code == EXIT_HANG, out[-2000:] + err[-4000:]
    _mpirun_named_exit_76(err)
    diagnosis = (run_dir / "hang" / "diagnosis.txt").read_text().strip()
    assert diagnosis.startswith("exatrain: HANG (a collective timed out in rank ")
    check_names_rank_1(diagnosis, others="0,2,3")
    assert err.count(diagnosis) == 1 and "Traceback" not in err, err[-4000:]
    attempt = run_dir / "hang" / "attempt-0"
    for rank in (0, 2, 3):  # the ranks that timed out keep their traceback on disk
        stacks = (attempt / f"timeout-rank-{rank}.txt").read_text()
        assert "Collective timeout in rank" in stacks and "distributed_c10d.py" in stacks, stacks
    # the sleeping rank's stacks: the leader's SIGUSR1 made its faulthandler write them
    assert (
        f'plain_hang.py", line {_line("STALL-LINE")} in main' in (attempt / "stacks-rank-1.txt").read_text()
    )
