"""`exatrain run` without starting anything: the torch env:// variables computed from a detected
environment (given as a mapping, as srun/mpirun/torchrun set it), the checks made before the script is
exec'd, the target checks and how the command line is split between exatrain and the script."""

import os
import socket

import pytest

from exatrain.cli.main import build_parser, split_run_argv
from exatrain.env import LocalEnvironment, MPIEnvironment, SlurmEnvironment, TorchElasticEnvironment
from exatrain.errors import ClusterEnvError, ExatrainError
from exatrain.launch.agent import failure_exit_code
from exatrain.launch.run import (
    Target,
    affinity_note,
    batch_shell_error,
    check_target,
    device_notes,
    rank_environment,
    torch_variables,
)

HOST = socket.gethostname()


def _slurm(rank=3, local=1, node=1, nodes="node[1-2]", **extra):
    """One task of `srun -N2 --ntasks-per-node=2` (step 0 of job 77), as srun sets its variables."""
    return {
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(local),
        "SLURM_NODEID": str(node),
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_NODELIST": nodes,
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        **extra,
    }


def test_slurm_task_gets_the_torchrun_contract():
    env = SlurmEnvironment(_slurm(), master_suffix="i")
    got = torch_variables(env)
    port = got.pop("MASTER_PORT")
    assert got == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "MASTER_ADDR": "node1i",
    }
    assert port == str(
        SlurmEnvironment(_slurm(rank=0, local=0, node=0)).main_port
    )  # one port for the whole step
    assert port != str(
        SlurmEnvironment({**_slurm(), "SLURM_STEP_ID": "1"}).main_port
    )  # another step, another port


def test_mpi_rank_uses_the_given_master():
    env = MPIEnvironment(
        {
            "OMPI_COMM_WORLD_RANK": "5",
            "OMPI_COMM_WORLD_SIZE": "8",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            "MASTER_ADDR": "head",
            "MASTER_PORT": "29511",
        }
    )
    # 4 ranks per node out of 8: several nodes, and MPI exports no node index, so GROUP_RANK is not guessed
    assert torch_variables(env) == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "head",
        "MASTER_PORT": "29511",
    }
    one_node = MPIEnvironment(
        {
            "OMPI_COMM_WORLD_RANK": "1",
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
            "MASTER_ADDR": "head",
            "MASTER_PORT": "29511",
        }
    )
    assert (
        torch_variables(one_node)["GROUP_RANK"] == "0"
        and torch_variables(one_node)["GROUP_WORLD_SIZE"] == "1"
    )


def test_torchrun_variables_are_kept_as_the_agent_set_them():
    environ = {
        "TORCHELASTIC_RUN_ID": "x",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "40000",
        "OTHER": "kept",
    }
    env = TorchElasticEnvironment(environ)
    child, notes = rank_environment(env, environ, affinity="off")
    assert torch_variables(env) == {} and child == environ


def test_rank_environment_keeps_the_rest_and_checks_the_master():
    environ = _slurm(rank=1, local=1, node=0, nodes=f"{HOST},{HOST}x", PATH="/bin", CUDA_VISIBLE_DEVICES="")
    child, notes = rank_environment(SlurmEnvironment(environ), environ, affinity="off")
    assert child["PATH"] == "/bin" and child["RANK"] == "1" and child["MASTER_ADDR"] == HOST
    assert notes == []
    bad = {**environ, "MASTER_ADDR": "localhost"}
    with pytest.raises(ClusterEnvError, match="loopback"):  # a 2-node job cannot meet on localhost
        rank_environment(SlurmEnvironment(bad), bad, affinity="off")


def test_one_gpu_per_task_is_device_0_and_said_so(tmp_path):
    env = SlurmEnvironment(_slurm())
    notes, gpu = device_notes(env, {"CUDA_VISIBLE_DEVICES": "3"}, root=str(tmp_path))
    assert gpu == 3 and len(notes) == 1 and "it is device 0" in notes[0] and "HINT:" in notes[0]
    assert device_notes(env, {"CUDA_VISIBLE_DEVICES": "0,1"}, root=str(tmp_path)) == ([], 1)
    assert device_notes(env, {}, root=str(tmp_path)) == ([], None)  # no GPU on this (fake) node: CPU
    three = SlurmEnvironment({**_slurm(rank=2, local=2, node=0), "SLURM_STEP_TASKS_PER_NODE": "3,1"})
    with pytest.raises(ClusterEnvError, match="share 2 visible GPUs"):
        device_notes(three, {"CUDA_VISIBLE_DEVICES": "0,1"}, root=str(tmp_path))


def test_affinity_mismatch_warns_or_fails():
    env = SlurmEnvironment(_slurm(rank=0, local=0, node=0))
    outside = 1 << (max(os.sched_getaffinity(0)) + 1)  # a core this process may not run on
    masks = (hex(outside),)
    assert "WARNING: CPU affinity of rank 0" in affinity_note(env, None, masks, "warn")
    with pytest.raises(ExatrainError, match="--affinity=strict"):
        affinity_note(env, None, masks, "strict")
    assert affinity_note(env, None, masks, "off") is None
    exact = hex(sum(1 << c for c in os.sched_getaffinity(0)))
    assert affinity_note(env, None, (exact,), "strict") is None


def test_batch_shell_is_refused_but_a_plain_machine_is_not():
    error = batch_shell_error(LocalEnvironment({"SLURM_JOB_ID": "5", "SLURM_NTASKS": "4"}))
    assert "batch shell" in str(error) and "srun exatrain run" in str(error)
    assert batch_shell_error(LocalEnvironment({})) is None


def test_target_checks(tmp_path):
    (tmp_path / "ok.py").write_text("print(1)\n")
    (tmp_path / "tool").write_text("#!/usr/bin/env python3\nprint(1)\n")
    (tmp_path / "run.sh").write_text("#!/bin/bash\necho hi\n")
    (tmp_path / "pkg").mkdir()
    assert check_target(Target("ok.py", False), str(tmp_path)).name == "ok.py"
    assert check_target(Target("tool", False), str(tmp_path)).name == "tool"  # a python #! line counts
    assert check_target(Target("json.tool", True), str(tmp_path)).is_module
    assert check_target(Target("pkg", True), str(tmp_path)).is_module  # found in the current directory
    for target, needle in [
        (Target("missing.py", False), "does not exist"),
        (Target("run.sh", False), "not a Python"),
        (Target("pkg", False), "not a Python"),
        (Target("nosuchmodule", True), "no module"),
        (Target("", True), "-m needs a module"),
        (None, "no script given"),
    ]:
        with pytest.raises(ExatrainError, match=needle) as exc:
            check_target(target, str(tmp_path))
        assert "HINT:" in str(exc.value)


@pytest.mark.parametrize(
    "argv, ours, target",
    [
        (["run", "train.py", "--nproc", "3"], ["run"], ["train.py", "--nproc", "3"]),
        (["run", "--nproc", "2", "train.py"], ["run", "--nproc", "2"], ["train.py"]),
        (
            ["run", "--nproc=2", "--resolve-master", "--", "--odd.py", "-x"],
            ["run", "--nproc=2", "--resolve-master"],
            ["--odd.py", "-x"],
        ),
        (
            ["run", "--profile", "lumi-g", "-m", "pkg.train", "--lr", "1"],
            ["run", "--profile", "lumi-g"],
            ["-m", "pkg.train", "--lr", "1"],
        ),
        (["run", "--nproc", "2"], ["run", "--nproc", "2"], None),
    ],
)
def test_command_line_split(argv, ours, target):
    assert split_run_argv(build_parser(), argv) == (ours, target)


@pytest.mark.parametrize("torch_code, shell_code", [(3, 3), (-9, 137), (-15, 143)])
def test_failed_worker_exit_code_as_a_shell_reports_it(torch_code, shell_code):
    assert failure_exit_code(torch_code) == shell_code
