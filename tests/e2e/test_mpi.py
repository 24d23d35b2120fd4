"""Real Open MPI (Debian's openmpi-bin: scripts/test.sh installs it) starting exatrain's ranks: `mpirun -n 4`
on this machine, and `mpirun --map-by node` over two "nodes" with 2 slots each. exatrain reads Open MPI's
OMPI_COMM_WORLD_* variables (exatrain/env/mpi.py); the checks: ranks, local ranks, node ranks (`exatrain
train` learns them from the ranks' host names once the group exists; `exatrain run` leaves GROUP_RANK unset
for a job over several nodes, since MPI exports no node index) and an all-reduce (and, for the trainer, the
weights DDP kept equal on every rank). `exatrain run` in both layouts, `exatrain train` (2 steps of the tiny
model) over the two nodes.

The two "nodes": Open MPI starts a daemon per host through its rsh agent (ssh, which this machine has no
server for). `--mca plm_rsh_agent` points it at a stand-in that runs the daemon's command here, in a new UTS
namespace named after the host (`unshare --uts`, root), so each node's ranks see their node's host name.
What the stand-in does not reproduce: separate machines and networks (every daemon shares this machine's
network; the hosts 127.0.0.2/.3 are loopback addresses, the master address is this machine's first
non-loopback address), and ssh's own environment handling. Open MPI as root needs OMPI_ALLOW_RUN_AS_ROOT=1
and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (set here).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, clean_environment
from tests.distributed.helpers import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SCRIPT = ROOT / "tests" / "peer_scripts" / "mpi_ranks.py"
FAKE_RSH = """#!/bin/sh
# Open MPI's rsh agent stand-in: "agent [options] HOST COMMAND..." runs COMMAND here,
# in a UTS namespace named HOST
while [ "${1#-}" != "$1" ]; do shift; done
host="$1"; shift
exec unshare --uts sh -c 'hostname "$0" && exec sh -c "$*"' "$host" "$@"
"""
TRAIN = [
    "train",
    "--train.steps=2",
    "--train.log_every=1",
    "--train.eval_every=0",
    "--train.eval_batches=1",
    "--train.eval_at_start=false",
    "--train.global_batch_size=4",
    "--train.micro_batch_size=1",
    "--train.save_model=false",
    "--data.seq_len=16",
]


def fake_rsh(tmp_path) -> Path:
    """FAKE_RSH written as an executable in `tmp_path`: the launchers' ssh agent for two "nodes"."""
    agent = tmp_path / "fake-rsh"
    agent.write_text(FAKE_RSH)
    agent.chmod(0o755)
    return agent


def _mpirun_or_skip() -> str:
    path = shutil.which("mpirun")
    if path is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes", "on"):
            pytest.fail("mpirun not found on CI: scripts/test.sh installs openmpi-bin")
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")
    return path


def _outside_address() -> str | None:
    """This machine's first non-loopback IPv4 address (a master address other "nodes" may use)."""
    r = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True)
    words = r.stdout.split()
    return words[words.index("inet") + 1].split("/")[0] if "inet" in words else None


def _mpirun(tmp_path, args, master: str, nodes: bool):
    """Run `mpirun_command` to its end."""
    cmd, env = mpirun_command(tmp_path, args, master, nodes)
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)


def mpirun_command(tmp_path, args, master: str, nodes: bool) -> tuple[list[str], dict[str, str]]:
    """`mpirun ... python -m exatrain.cli.main ARGS` as root, MASTER_ADDR and MASTER_PORT exported: the
    command and its environment (tests/e2e/test_mpi_hangs.py starts it too)."""
    env = clean_environment(
        {
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMP_NUM_THREADS": "1",
            "MASTER_ADDR": master,
            "MASTER_PORT": str(free_port()),
        }
    )
    where = ["-n", "4"]
    if nodes:
        agent = fake_rsh(tmp_path)
        where = [
            "--mca",
            "plm_rsh_agent",
            str(agent),
            "--host",
            "127.0.0.2:2,127.0.0.3:2",
            "--map-by",
            "node",
            "-n",
            "4",
        ]
    cmd = [
        _mpirun_or_skip(),
        "--oversubscribe",
        *where,
        "-x",
        "MASTER_ADDR",
        "-x",
        "MASTER_PORT",
        "-x",
        "OMP_NUM_THREADS",
        "-x",
        "PYTHONPATH",
        sys.executable,
        "-m",
        "exatrain.cli.main",
        *args,
    ]
    env["PYTHONPATH"] = str(ROOT)
    return cmd, env


def _placement(nodes: bool):
    """(rank, local rank, node) of each rank: --map-by node deals the ranks round-robin over the nodes."""
    if not nodes:
        return [(r, r, 0) for r in range(4)]
    return [(r, r // 2, r % 2) for r in range(4)]


@pytest.mark.parametrize("nodes", [False, True], ids=["one-node", "map-by-node"])
def test_exatrain_run_under_mpirun(tmp_path, nodes):
    master = _outside_address() if nodes else "127.0.0.1"
    if master is None:
        pytest.skip("no non-loopback address for a master that two nodes share")
    out = tmp_path / "ranks"
    out.mkdir()
    r = _mpirun(tmp_path, ["run", str(SCRIPT), str(out)], master, nodes)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ranks = [json.loads((out / f"rank-{i}.json").read_text()) for i in range(4)]
    local_world = "2" if nodes else "4"
    seen = [
        (
            int(x["seen"]["RANK"]),
            int(x["seen"]["LOCAL_RANK"]),
            x["seen"]["WORLD_SIZE"],
            x["seen"]["LOCAL_WORLD_SIZE"],
        )
        for x in ranks
    ]
    assert seen == [(rank, local, "4", local_world) for rank, local, _ in _placement(nodes)]
    # one node: its index is 0; several: MPI exports none, exatrain guesses none
    assert [x["seen"]["GROUP_RANK"] for x in ranks] == (["0"] * 4 if not nodes else [None] * 4)
    assert {x["seen"]["MASTER_ADDR"] for x in ranks} == {master}
    if nodes:
        assert [x["host"] for x in ranks] == ["127.0.0.2", "127.0.0.3", "127.0.0.2", "127.0.0.3"]
    assert [(x["rank"], x["world_size"], x["sum_of_rank_plus_one"]) for x in ranks] == [
        (i, 4, 10.0) for i in range(4)
    ]


def test_exatrain_train_under_mpirun_map_by_node(tmp_path):
    """Over two nodes only (the one-node layout is `exatrain run`'s test above; this keeps CI short)."""
    nodes = True
    master = _outside_address()
    if master is None:
        pytest.skip("no non-loopback address for a master that two nodes share")
    run = tmp_path / "run"
    r = _mpirun(tmp_path, [*TRAIN, f"--run.dir={run}"], master, nodes)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ranks = [json.loads((run / "ranks" / f"rank-{i}.json").read_text()) for i in range(4)]
    assert [(x["kind"], x["global_rank"], x["local_rank"], x["node_rank"]) for x in ranks] == [
        ("mpi", rank, local, node) for rank, local, node in _placement(nodes)
    ]
    assert {(x["world_size"], x["num_nodes"]) for x in ranks} == {(4, 2)}
    assert [x["hostname"] for x in ranks] == ["127.0.0.2", "127.0.0.3", "127.0.0.2", "127.0.0.3"]
    assert len({x["weights_sha256"] for x in ranks}) == 1  # DDP's all-reduced gradients kept them equal
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["world_size"] == 4 and summary["weights_in_sync"]
