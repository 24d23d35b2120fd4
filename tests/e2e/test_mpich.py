"""Real MPICH (Debian's `mpich` 4.0.2, its Hydra launcher `mpiexec.mpich`; scripts/test.sh installs it next
to Open MPI, whose `mpirun` stays the default of Debian's alternatives) starting `exatrain run` in every
rank. exatrain reads Hydra's PMI_RANK, PMI_SIZE, MPI_LOCALRANKID and MPI_LOCALNRANKS (exatrain/env/mpi.py);
MASTER_ADDR/MASTER_PORT reach the ranks through `-genv`.

- `mpiexec.mpich -n 4` over two "nodes" (2 slots each, Hydra's default block placement: ranks 0,1 on the
  first): the launcher's variables as measured, the torch variables exatrain made of them, an all-reduce;
- the hang watcher (tests/e2e/test_mpi_hangs.py's runs, on one node and over the two nodes) and the
  unmodified script's collective timeout: the diagnosis printed once and mpiexec's exit code 76.

What Hydra 4.0.2 does differently from Open MPI's mpirun (measured here; its mpiexec.c): it stops no rank
when another exits with a non-zero code (it waits for every rank while none calls MPI itself), prints
nothing for such an exit, and returns the bitwise OR of its ranks' exit codes (a rank killed by a signal:
the signal's number, with its "BAD TERMINATION" banner). So every rank must leave with 76 by itself: the
rank that slept while the others timed out in the collective leaves once the diagnosis is written
(`launch.hang_exit`; before it, mpiexec waited for it forever). `-print-all-exitcodes` lists each rank's
wait status (76 << 8 = 19456), which the tests read.

The two "nodes": Hydra's ssh launcher, pointed by `-launcher-exec` at test_mpi.py's stand-in for ssh (each
node's proxy in its own UTS namespace named after the host, on this machine). What it does not reproduce:
separate machines and networks (the hosts 127.0.0.2/.3 are loopback addresses, the master address is this
machine's first non-loopback address, the proxies call mpiexec back at this machine's host name) and ssh's
own environment handling (Hydra sends the environment through its proxies, not through ssh).
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from exatrain.errors import EXIT_HANG
from tests.conftest import ROOT, clean_environment
from tests.distributed.helpers import free_port
from tests.distributed.test_hangs import check_rank_2_named
from tests.distributed.test_stack_dump import check_names_rank_1
from tests.e2e.test_mpi import SCRIPT, _outside_address, fake_rsh
from tests.e2e.test_mpi_hangs import TIMEOUT_S, start_hang_runs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MPIEXEC = "mpiexec.mpich"
#: what Hydra says when a rank was killed by a signal (never, when every rank exits with 76)
BANNER = "BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES"


def _mpiexec_or_skip() -> str:
    path = shutil.which(MPIEXEC)
    if path is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes", "on"):
            pytest.fail(f"{MPIEXEC} not found on CI: scripts/test.sh installs mpich")
        pytest.skip(f"{MPIEXEC} not found (apt-get install mpich)")
    return path


def mpiexec_command(tmp_path, args, master: str, nodes: bool) -> tuple[list[str], dict[str, str]]:
    """`mpiexec.mpich -n 4 ... python -m exatrain.cli.main ARGS`, MASTER_ADDR/MASTER_PORT given with
    -genv (not in mpiexec's own environment): the command and its environment."""
    where = ["-n", "4"]
    if nodes:
        agent = fake_rsh(tmp_path)
        where = [
            "-launcher",
            "ssh",
            "-launcher-exec",
            str(agent),
            "-hosts",
            "127.0.0.2:2,127.0.0.3:2",
            *where,
        ]
    genv = {"MASTER_ADDR": master, "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
    cmd = [
        _mpiexec_or_skip(),
        "-print-all-exitcodes",
        *where,
        *(word for name, value in genv.items() for word in ("-genv", name, value)),
        sys.executable,
        "-m",
        "exatrain.cli.main",
        *args,
    ]
    env = clean_environment({"PYTHONPATH": str(ROOT)})
    env = {k: v for k, v in env.items() if k not in ("MPI_LOCALRANKID", "MPI_LOCALNRANKS")}
    return cmd, env


def exit_codes(out: str) -> dict[str, list[int]]:
    """host -> its ranks' wait statuses, from the lines `-print-all-exitcodes` prints ('[mpiexec@vm] Exit
    codes: [vm] 19456,19456' and, per further host, '[host] ...')."""
    text = out[out.rindex("Exit codes: ") :]
    return {
        host: [int(c) for c in codes.split(",")]
        for host, codes in re.findall(r"\[([^\]@]+)\] ([\d,]+)", text)
    }


def test_exatrain_run_under_mpiexec_mpich_over_two_nodes(tmp_path):
    master = _outside_address()
    if master is None:
        pytest.skip("no non-loopback address for a master that two nodes share")
    out = tmp_path / "ranks"
    out.mkdir()
    cmd, env = mpiexec_command(tmp_path, ["run", str(SCRIPT), str(out)], master, nodes=True)
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert exit_codes(r.stdout) == {"127.0.0.2": [0, 0], "127.0.0.3": [0, 0]}
    ranks = [json.loads((out / f"rank-{i}.json").read_text()) for i in range(4)]
    placement = [(0, 0, "127.0.0.2"), (1, 1, "127.0.0.2"), (2, 0, "127.0.0.3"), (3, 1, "127.0.0.3")]
    # what Hydra sets (measured; no OMPI_* of course) ...
    assert [x["launcher"] for x in ranks] == [
        {"PMI_RANK": str(rank), "PMI_SIZE": "4", "MPI_LOCALRANKID": str(local), "MPI_LOCALNRANKS": "2"}
        for rank, local, _ in placement
    ]
    # ... and what exatrain made of it: GROUP_RANK unset over several nodes (MPI exports no node index)
    assert [(x["seen"]["RANK"], x["seen"]["LOCAL_RANK"], x["host"]) for x in ranks] == [
        (str(rank), str(local), host) for rank, local, host in placement
    ]
    assert {
        (
            x["seen"]["WORLD_SIZE"],
            x["seen"]["LOCAL_WORLD_SIZE"],
            x["seen"]["GROUP_RANK"],
            x["seen"]["MASTER_ADDR"],
        )
        for x in ranks
    } == {("4", "2", None, master)}
    assert [(x["rank"], x["world_size"], x["sum_of_rank_plus_one"]) for x in ranks] == [
        (i, 4, 10.0) for i in range(4)
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> (exit code of mpiexec, stdout, stderr, run dir) of the three runs, started together (None:
    not run)."""
    return start_hang_runs(tmp_path_factory.mktemp("mpich-hangs"), mpiexec_command)


def _every_rank_exited_76(out: str, err: str, hosts: tuple[str, ...] = (socket.gethostname(),)) -> None:
    """Hydra's own report: each rank's wait status (exit code 76), and no banner of a rank it had to kill."""
    per_host = exit_codes(out)
    assert sorted(per_host) == sorted(hosts), out[-2000:]
    assert [c for codes in per_host.values() for c in codes] == [EXIT_HANG << 8] * 4, out[-2000:]
    assert BANNER not in out + err


def test_a_rank_sleeping_under_mpiexec_mpich_is_named_with_its_line(runs):
    code, out, err, run_dir = runs["watched"]
    check_rank_2_named(code, out, err, run_dir, "sleep", TIMEOUT_S)  # mpiexec's exit code: 76
    _every_rank_exited_76(out, err)
    diagnosis = (run_dir / "hang" / "diagnosis.txt").read_text().strip()
    assert err.count(diagnosis) == 1, err[-4000:]  # the leader's, whole, once
    assert f"rank 2 ({socket.gethostname()}, pid " in diagnosis  # each rank's place from PMI_RANK


def test_over_two_nodes_the_stalled_ranks_node_is_the_suspect(runs):
    if runs["nodes"] is None:
        pytest.skip("no non-loopback address for a master that two nodes share")
    code, out, err, run_dir = runs["nodes"]
    # exatrain.init learns the node layout from the host names first (2 collectives): all_reduce #9
    check_rank_2_named(code, out, err, run_dir, "sleep", TIMEOUT_S, collective=9)
    _every_rank_exited_76(out, err, hosts=("127.0.0.2", "127.0.0.3"))
    diagnosis = (run_dir / "hang" / "diagnosis.txt").read_text().strip()
    assert "rank 2 (127.0.0.3, pid " in diagnosis  # block placement: ranks 2 and 3 on the second node
    assert diagnosis.endswith(
        "Suspect node(s): 127.0.0.3 (a SLURM job with job.hang_requeues is requeued without them)."
    )
    assert (run_dir / "hang" / "exclude").read_text() == "127.0.0.3\n"


def test_an_unmodified_scripts_collective_timeout_under_mpiexec_mpich_gives_one_diagnosis(runs):
    """The sleeping rank 1 never times out: it leaves with 76 once the diagnosis is written
    (`launch.hang_exit`), so mpiexec, which stops no rank itself, ends with 76."""
    code, out, err, run_dir = runs["plain"]
    assert code == EXIT_HANG, out[-2000:] + err[-4000:]
    _every_rank_exited_76(out, err)
    diagnosis = (run_dir / "hang" / "diagnosis.txt").read_text().strip()
    assert diagnosis.startswith("exatrain: HANG (a collective timed out in rank ")
    check_names_rank_1(diagnosis, others="0,2,3")
    assert err.count(diagnosis) == 1 and "Traceback" not in err, err[-4000:]
    attempt = run_dir / "hang" / "attempt-0"
    assert not (attempt / "timeout-rank-1.txt").exists()  # it left by hang_exit, not by a timeout of its own
