"""Hang-proof start: master addresses that would make ranks wait forever are refused at once, with a HINT."""

import socket

import pytest

from exatrain.env import detect_environment
from exatrain.env.master_check import check_master
from exatrain.errors import ClusterEnvError

HOST = socket.gethostname()


def _slurm(node_rank, master=None, nodes="n[1-2]", tasks="1(x2)", world=2):
    """Rank `node_rank` of a 2-node srun step, as SLURM describes it (optionally with a MASTER_ADDR
    export)."""
    env = {
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(node_rank),
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": str(node_rank),
        "SLURM_STEP_NODELIST": nodes,
        "SLURM_STEP_NUM_TASKS": str(world),
        "SLURM_STEP_TASKS_PER_NODE": tasks,
    }
    if master:
        env["MASTER_ADDR"] = master
    return detect_environment(env)


def _accept(host):
    return "10.0.0.1"


@pytest.mark.parametrize("master", ["localhost", "127.0.0.1", "::1"])
def test_loopback_master_on_several_nodes(master):
    with pytest.raises(ClusterEnvError, match="loopback address, but the job spans 2 nodes") as e:
        check_master(_slurm(0, master), resolve=_accept)
    assert "unset MASTER_ADDR" in e.value.hint


def test_own_hostname_on_a_later_node():
    with pytest.raises(
        ClusterEnvError, match="own host name, but rank 1 on node 1 of 2 is not on the first node"
    ) as e:
        check_master(_slurm(1, HOST), resolve=_accept)
    assert "SLURM_JOB_NODELIST" in e.value.hint
    check_master(_slurm(0, HOST), resolve=_accept)  # on the first node its own name is right


def test_unresolvable_master_is_refused_with_a_hint(monkeypatch):
    """The real resolve_host with a FAKE resolver: socket.gethostbyname answers as the C library does for an
    unknown name (socket.gaierror), so the test does not depend on this machine's DNS or its speed (a
    dropping resolver takes 10 s to say no)."""
    asked = []

    def unknown(host):
        asked.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "gethostbyname", unknown)
    with pytest.raises(
        ClusterEnvError, match="cannot resolve the master host 'no-such-node-exatrain.invalid'"
    ) as e:
        check_master(_slurm(0, "no-such-node-exatrain.invalid"))
    assert asked == ["no-such-node-exatrain.invalid"] and "suffix" in e.value.hint


def test_good_and_single_process_cases_pass():
    check_master(_slurm(1), resolve=_accept)  # derived master n1 from the node list, on node 2
    single = _slurm(0, "localhost", nodes="n1", tasks="2", world=2)
    check_master(single, resolve=lambda h: "127.0.0.1")  # one node: localhost is fine
    alone = detect_environment({})
    check_master(alone, resolve=lambda h: pytest.fail("a single process needs no master"))
