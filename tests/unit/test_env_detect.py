"""Environment detection from plain dicts shaped like what each launcher really sets."""

import json
import socket
import subprocess
import sys

import pytest

from exatrain.env import ORDER, ClusterEnvironment, derive_port, detect_environment
from exatrain.env.base import node_layout
from exatrain.env.local import LocalEnvironment
from exatrain.env.slurm import SlurmEnvironment
from exatrain.env.torchelastic import TorchElasticEnvironment
from exatrain.errors import ClusterEnvError

JOB = "4242"

# Job-level variables of `sbatch -N2 --ntasks-per-node=2` (slurm 22.05), present in batch shell and steps.
JOB_VARS = {
    "SLURM_JOB_ID": JOB,
    "SLURM_JOBID": JOB,
    "SLURM_NTASKS": "4",
    "SLURM_NNODES": "2",
    "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_NODELIST": "node[1-2]",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_SUBMIT_DIR": "/home/user/run",
}

BATCH_SHELL = {**JOB_VARS, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}


def srun_task(procid, localid, nodeid, *, ntasks=4, nnodes=2, tasks_per_node="2(x2)", nodelist="node[1-2]"):
    """One task of `srun -N{nnodes} -n{ntasks}` inside the job above."""
    hosts = ["node1", "node2", "node3", "node4"]
    return {
        **JOB_VARS,
        "SLURM_STEP_ID": "0",
        "SLURM_STEPID": "0",
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": str(nodeid),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_STEP_NUM_NODES": str(nnodes),
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        "SLURMD_NODENAME": hosts[nodeid],
    }


def torchrun_worker(rank, *, nproc=4, nnodes=2, addr="node1", port="29400"):
    """One worker of `torchrun --nnodes={nnodes} --nproc-per-node={nproc}`."""
    return {
        "TORCHELASTIC_RUN_ID": "exa",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "RANK": str(rank),
        "WORLD_SIZE": str(nproc * nnodes),
        "LOCAL_RANK": str(rank % nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": str(rank // nproc),
        "GROUP_WORLD_SIZE": str(nnodes),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(nproc * nnodes),
        "MASTER_ADDR": addr,
        "MASTER_PORT": port,
    }


def layout(env):
    return (
        env.world_size,
        env.global_rank,
        env.local_rank,
        env.local_world_size,
        env.node_rank,
        env.num_nodes,
    )


def assert_env_error(environ, *names, **kwargs):
    with pytest.raises(ClusterEnvError) as info:
        detect_environment(environ, **kwargs)
    text = str(info.value)
    assert "HINT:" in text
    for name in names:
        assert name in text
    return text


# --- kinds ------------------------------------------------------------------------------------------


def test_order_tries_torchelastic_before_slurm_and_local_last():
    assert ORDER.index(TorchElasticEnvironment) < ORDER.index(SlurmEnvironment)
    assert ORDER[-1] is LocalEnvironment


def test_torchrun():
    env = detect_environment(torchrun_worker(5))
    assert env.kind == "torchelastic"
    assert layout(env) == (8, 5, 1, 4, 1, 2)
    assert (env.main_address, env.main_port) == ("node1", 29400)
    assert env.job_id is None and env.is_distributed


def test_torchrun_without_group_world_size_derives_num_nodes():
    environ = torchrun_worker(2, nproc=2, nnodes=3)
    del environ["GROUP_WORLD_SIZE"]
    assert detect_environment(environ).num_nodes == 3


def test_torchrun_inside_slurm_step_is_torchelastic():
    # `srun -N2 --ntasks-per-node=1 torchrun --nproc-per-node=4 ...`: worker 6 runs in srun task 1.
    environ = {**srun_task(1, 0, 1, ntasks=2, tasks_per_node="1(x2)"), **torchrun_worker(6)}
    env = detect_environment(environ)
    assert env.kind == "torchelastic"
    assert layout(env) == (8, 6, 2, 4, 1, 2)
    assert env.main_port == 29400
    assert env.job_id == JOB


@pytest.mark.parametrize(("procid", "localid", "nodeid"), [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)])
def test_srun_two_nodes_two_tasks_each(procid, localid, nodeid):
    env = detect_environment(srun_task(procid, localid, nodeid))
    assert env.kind == "slurm"
    assert layout(env) == (4, procid, localid, 2, nodeid, 2)
    assert env.main_address == "node1"
    assert env.main_port == derive_port(JOB, "0")
    assert env.job_id == JOB and env.notes == ()


@pytest.mark.parametrize(
    ("procid", "localid", "nodeid", "local_world"), [(0, 0, 0, 2), (1, 1, 0, 2), (2, 0, 1, 1)]
)
def test_srun_uneven_step_uses_step_variables(procid, localid, nodeid, local_world):
    environ = srun_task(procid, localid, nodeid, ntasks=3, tasks_per_node="2,1")
    env = detect_environment(environ)
    assert layout(env) == (3, procid, localid, local_world, nodeid, 2)


def test_step_on_part_of_the_allocation_takes_master_from_step_nodelist():
    environ = {**srun_task(0, 0, 0, ntasks=2, tasks_per_node="1(x2)", nodelist="node[3-4]")}
    environ.update(SLURM_JOB_NODELIST="node[1-4]", SLURM_NODELIST="node[1-4]", SLURM_TASKS_PER_NODE="2(x4)")
    env = detect_environment(environ)
    assert (env.main_address, env.world_size, env.num_nodes) == ("node3", 2, 2)


def test_srun_without_step_variables_falls_back_to_job_variables():
    environ = {key: value for key, value in srun_task(3, 1, 1).items() if not key.startswith("SLURM_STEP_")}
    environ["SLURM_STEP_ID"] = environ["SLURM_STEPID"] = "0"
    env = detect_environment(environ)
    assert layout(env) == (4, 3, 1, 2, 1, 2)


def test_steps_of_one_job_get_different_ports():
    first = detect_environment(srun_task(0, 0, 0))
    second = detect_environment({**srun_task(0, 0, 0), "SLURM_STEP_ID": "1", "SLURM_STEPID": "1"})
    assert first.main_port != second.main_port


def test_batch_shell_is_local_with_a_note():
    env = detect_environment(BATCH_SHELL)
    assert env.kind == "local"
    assert layout(env) == (1, 0, 0, 1, 0, 1)
    assert env.job_id == JOB
    (note,) = env.notes
    assert f"job {JOB}" in note and "batch" in note and "srun" in note and "4 tasks" in note


def test_open_mpi():
    environ = {
        "OMPI_COMM_WORLD_RANK": "5",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        "OMPI_COMM_WORLD_NODE_RANK": "1",  # a per-node process rank in Open MPI, not the node index
        "MASTER_ADDR": "cn01",
    }
    env = detect_environment(environ)
    assert env.kind == "mpi"
    # no node index from Open MPI: unknown until the group exists, never guessed (see test_mpi_node_layout_*)
    assert layout(env) == (8, 5, 1, 4, None, None)
    assert (env.main_address, env.main_port) == ("cn01", 29500)


def test_mpich_pmi():
    environ = {
        "PMI_RANK": "2",
        "PMI_SIZE": "4",
        "MPI_LOCALRANKID": "0",
        "MPI_LOCALNRANKS": "2",
        "MASTER_ADDR": "10.0.0.7",
        "MASTER_PORT": "31000",
    }
    env = detect_environment(environ)
    assert env.kind == "mpi"
    assert layout(env) == (4, 2, 0, 2, None, None)
    assert (env.main_address, env.main_port) == ("10.0.0.7", 31000)


def _ompi(rank, size, local_rank, local_size, **more):
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        **more,
    }


def test_mpi_on_one_node_knows_its_node():
    assert layout(detect_environment(_ompi(1, 2, 1, 2, MASTER_ADDR="a"))) == (2, 1, 1, 2, 0, 1)


def test_mpi_map_by_node_is_not_refused_for_a_master_on_its_own_node():
    """mpirun --map-by node on hosts a, b: ranks 0, 2 on a, ranks 1, 3 on b (local sizes 2). Rank 2 runs on
    a = MASTER_ADDR; rank // local_size would put it on node 1 and refuse the valid job as
    'MASTER_ADDR=$(hostname) on every node'."""
    from exatrain.env.master_check import check_master

    here = socket.gethostname()
    env = detect_environment(_ompi(2, 4, 1, 2, MASTER_ADDR=here, OMPI_MCA_rmaps_base_mapping_policy="node"))
    assert (env.node_rank, env.num_nodes, env.spans_nodes) == (None, None, True)
    check_master(env, resolve=lambda host: host)  # no error


def test_mpi_loopback_master_over_several_nodes_is_still_refused():
    from exatrain.env.master_check import check_master

    env = detect_environment(_ompi(3, 4, 1, 2, MASTER_ADDR="localhost"))
    with pytest.raises(ClusterEnvError, match="spans several nodes"):
        check_master(env, resolve=lambda host: host)


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        (["a", "a", "b", "b"], [(0, 2), (0, 2), (1, 2), (1, 2)]),  # by slot
        (["a", "b", "a", "b"], [(0, 2), (1, 2), (0, 2), (1, 2)]),  # --map-by node
        (["a", "a", "a", "b"], [(0, 2), (0, 2), (0, 2), (1, 2)]),  # uneven hosts (a:3, b:1)
        (["b", "a", "c"], [(0, 3), (1, 3), (2, 3)]),  # any order: by first rank
    ],
)
def test_mpi_node_layout_from_host_names(hosts, expected):
    assert [node_layout(hosts, r) for r in range(len(hosts))] == expected


def test_node_layout_is_learnt_once_the_group_exists():
    env = detect_environment(_ompi(1, 4, 0, 2, MASTER_ADDR="a"))
    learnt = env.with_node_layout(*node_layout(["a", "b", "a", "b"], env.global_rank))
    assert layout(learnt) == (4, 1, 0, 2, 1, 2) and env.node_rank is None


def test_single_rank_mpi_uses_loopback():
    environ = {"PMI_RANK": "0", "PMI_SIZE": "1", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}
    env = detect_environment(environ)
    assert (env.kind, env.main_address, env.is_distributed) == ("mpi", "127.0.0.1", False)


def test_mpi_without_master_addr_names_how_each_launcher_passes_it_on():
    environ = {"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"}
    with pytest.raises(ClusterEnvError) as e:
        _ = detect_environment(environ).main_address
    assert "MASTER_ADDR is not set" in str(e.value) and "(4 ranks)" in str(e.value)
    assert "mpirun -x MASTER_ADDR" in e.value.hint  # Open MPI
    assert "mpiexec -genv MASTER_ADDR $MASTER_ADDR" in e.value.hint  # MPICH's Hydra (tests/e2e/test_mpich.py)


def test_local():
    env = detect_environment({})
    assert env.kind == "local"
    assert layout(env) == (1, 0, 0, 1, 0, 1)
    assert (env.main_address, env.main_port, env.job_id, env.notes) == ("127.0.0.1", 29500, None, ())


def test_to_dict_is_json_able_and_complete():
    env = detect_environment(srun_task(2, 0, 1))
    data = json.loads(json.dumps(env.to_dict()))
    assert data["kind"] == "slurm" and data["global_rank"] == 2 and data["notes"] == []
    assert data["hostname"] == env.hostname and data["is_distributed"] is True
    assert isinstance(env, ClusterEnvironment)


# --- master address and port -----------------------------------------------------------------------


def test_master_port_env_then_argument():
    environ = {**srun_task(0, 0, 0), "MASTER_PORT": "31337"}
    assert detect_environment(environ).main_port == 31337
    assert detect_environment(environ, master_port=32000).main_port == 32000
    assert detect_environment({}, master_port=32001).main_port == 32001


def test_master_addr_env_is_honoured_by_slurm():
    assert detect_environment({**srun_task(1, 1, 0), "MASTER_ADDR": "login7"}).main_address == "login7"


def test_master_suffix_jsc_infiniband():
    environ = srun_task(0, 0, 0, nodelist="jrc[0001-0002]")
    assert detect_environment(environ, master_suffix="i").main_address == "jrc0001i"


def test_resolve_master_localhost():
    environ = srun_task(0, 0, 0, ntasks=2, nnodes=1, tasks_per_node="2", nodelist="localhost")
    assert detect_environment(environ, resolve_master=True).main_address == "127.0.0.1"


def test_resolve_master_unresolvable():
    environ = srun_task(0, 0, 0, nodelist="node[1-2]")
    assert_env_error(environ, "node1.invalid", master_suffix=".invalid", resolve_master=True)


# --- contradictions and malformed values -----------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "names"),
    [
        ({"SLURM_PROCID": "4"}, ["SLURM_PROCID", "SLURM_STEP_NUM_TASKS"]),
        ({"SLURM_LOCALID": "2"}, ["SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE"]),
        ({"SLURM_NODEID": "2"}, ["SLURM_NODEID", "SLURM_STEP_NODELIST"]),
        ({"SLURM_STEP_TASKS_PER_NODE": "2,1"}, ["SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NUM_TASKS"]),
        ({"SLURM_STEP_TASKS_PER_NODE": "4"}, ["SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_NODELIST"]),
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x)"}, ["SLURM_STEP_TASKS_PER_NODE"]),
        ({"SLURM_STEP_NODELIST": "node[1-"}, ["SLURM_STEP_NODELIST"]),
        ({"SLURM_PROCID": "zero"}, ["SLURM_PROCID"]),
        ({"SLURM_LOCALID": "-1"}, ["SLURM_LOCALID"]),
        ({"SLURM_STEP_NUM_TASKS": "0"}, ["SLURM_STEP_NUM_TASKS"]),
        ({"SLURM_NODEID": "1.0"}, ["SLURM_NODEID"]),
        ({"MASTER_PORT": "80"}, ["MASTER_PORT"]),
        ({"MASTER_PORT": "auto"}, ["MASTER_PORT"]),
    ],
)
def test_slurm_contradictions(changes, names):
    assert_env_error({**srun_task(0, 0, 0), **changes}, *names)


@pytest.mark.parametrize("missing", ["SLURM_LOCALID", "SLURM_NODEID"])
def test_slurm_missing_rank_variable(missing):
    environ = srun_task(0, 0, 0)
    del environ[missing]
    assert_env_error(environ, missing)


def test_slurm_missing_tasks_per_node():
    environ = srun_task(0, 0, 0)
    del environ["SLURM_STEP_TASKS_PER_NODE"], environ["SLURM_TASKS_PER_NODE"]
    assert_env_error(environ, "SLURM_STEP_TASKS_PER_NODE")


def test_master_port_argument_is_validated():
    assert_env_error({}, "master_port", "70000", master_port=70000)


@pytest.mark.parametrize(
    ("changes", "names"),
    [
        ({"RANK": "8"}, ["RANK", "WORLD_SIZE"]),
        ({"LOCAL_RANK": "4"}, ["LOCAL_RANK", "LOCAL_WORLD_SIZE"]),
        ({"GROUP_RANK": "2"}, ["GROUP_RANK", "GROUP_WORLD_SIZE"]),
        ({"LOCAL_WORLD_SIZE": "16"}, ["LOCAL_WORLD_SIZE", "WORLD_SIZE"]),
        ({"WORLD_SIZE": "eight"}, ["WORLD_SIZE"]),
        ({"MASTER_PORT": "99999"}, ["MASTER_PORT"]),
        ({"MASTER_ADDR": ""}, ["MASTER_ADDR"]),
        ({"LOCAL_WORLD_SIZE": ""}, ["LOCAL_WORLD_SIZE"]),
    ],
)
def test_torchelastic_contradictions(changes, names):
    assert_env_error({**torchrun_worker(0), **changes}, *names)


@pytest.mark.parametrize(
    ("environ", "names"),
    [
        (
            {
                "OMPI_COMM_WORLD_RANK": "4",
                "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
                "MASTER_ADDR": "cn01",
            },
            ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"],
        ),
        (
            {
                "OMPI_COMM_WORLD_RANK": "0",
                "OMPI_COMM_WORLD_SIZE": "4",
                "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            },
            ["MASTER_ADDR", "hostname"],
        ),
        (
            {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MASTER_ADDR": "cn01"},
            ["MPI_LOCALNRANKS"],
        ),
        (
            {
                "PMI_RANK": "0",
                "PMI_SIZE": "2",
                "MPI_LOCALRANKID": "0",
                "MPI_LOCALNRANKS": "4",
                "MASTER_ADDR": "x",
            },
            ["MPI_LOCALNRANKS", "PMI_SIZE"],
        ),
    ],
)
def test_mpi_contradictions(environ, names):
    assert_env_error(environ, *names)


# --- layering ----------------------------------------------------------------------------------------


def test_importing_env_does_not_import_torch_or_numpy():
    code = (
        "import sys, exatrain.env, exatrain.env.devices; "
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_restart_count_from_torchrun_or_slurm():
    from exatrain.env import detect_environment

    assert detect_environment({}).restart_count == 0
    assert detect_environment({"SLURM_RESTART_COUNT": "2"}).restart_count == 2
    torchrun = {
        "TORCHELASTIC_RUN_ID": "x",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RESTART_COUNT": "1",
    }
    assert detect_environment(torchrun).restart_count == 1


def test_note_when_torchrun_may_restart_with_a_shared_store():
    """torch 2.13's agent keeps its shared store across restarts (pytorch#135712): say how to avoid it."""
    torchrun = {
        "TORCHELASTIC_RUN_ID": "x",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_MAX_RESTARTS": "2",
    }
    assert detect_environment(torchrun).notes == ()
    shared = detect_environment({**torchrun, "TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert len(shared.notes) == 1 and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in shared.notes[0]
    assert detect_environment({**torchrun, "TORCHELASTIC_USE_AGENT_STORE": "False"}).notes == ()
    assert (
        detect_environment(
            {**torchrun, "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "0"}
        ).notes
        == ()
    )


def test_who_hosts_the_store_under_torchrun_and_elsewhere():
    """With the agent's store shared, ranks are its clients; with sharing off (as `--max-restarts` sets it)
    rank 0 must host the store at MASTER_PORT itself, as under srun or mpirun."""
    torchrun = {
        "TORCHELASTIC_RUN_ID": "x",
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "29500",
    }
    assert detect_environment({**torchrun, "TORCHELASTIC_USE_AGENT_STORE": "True"}).launcher_hosts_store
    assert not detect_environment({**torchrun, "TORCHELASTIC_USE_AGENT_STORE": "False"}).launcher_hosts_store
    assert not detect_environment(torchrun).launcher_hosts_store
    assert not detect_environment(
        {
            "OMPI_COMM_WORLD_RANK": "0",
            "OMPI_COMM_WORLD_SIZE": "2",
            "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            "MASTER_ADDR": "h",
        }
    ).launcher_hosts_store


def test_local_launch_turns_store_sharing_off_only_when_restarts_are_allowed():
    from exatrain.launch.local import agent_environment

    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in agent_environment(0, {"PATH": "/bin"})
    assert agent_environment(2, {"PATH": "/bin"}) == {
        "PATH": "/bin",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }
