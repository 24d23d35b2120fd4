"""The SLURM testbed itself: nodes, fake GPUs, rejections, batch jobs. Quick (a few seconds)."""

from __future__ import annotations

import os
import time
from collections import Counter

import pytest

pytestmark = pytest.mark.slurm

ECHO = 'echo "$SLURMD_NODENAME $SLURM_LOCALID ${CUDA_VISIBLE_DEVICES-unset} $(hostname)"'


@pytest.fixture
def two_nodes(slurm_cluster):
    if len(slurm_cluster.nodes) < 2:
        pytest.skip("needs STB_NODES >= 2")
    return slurm_cluster.nodes[:2]


@pytest.fixture
def gpus(slurm_cluster):
    if slurm_cluster.gpus_per_node < 2:
        pytest.skip("needs STB_GPUS >= 2")
    return slurm_cluster.gpus_per_node


def _ok(proc):
    assert proc.returncode == 0, f"{proc.args} exited {proc.returncode}:\n{proc.stderr}"
    return proc.stdout


def _rows(stdout):
    """`node localid cuda hostname` lines -> {node: {localid: cuda}}, checking hostname == node."""
    per_node: dict[str, dict[int, str]] = {}
    for line in stdout.splitlines():
        node, localid, cuda, host = line.split()
        assert host == node, f"task on {node} sees hostname {host}"
        per_node.setdefault(node, {})[int(localid)] = cuda
    return per_node


def test_srun_spans_nodes(slurm_cluster, two_nodes):
    out = _ok(slurm_cluster.run(["srun", "-N2", "-n4", "hostname"], timeout=60))
    assert Counter(out.split()) == {two_nodes[0]: 2, two_nodes[1]: 2}


def test_gpus_per_node_visible_to_every_task(slurm_cluster, two_nodes, gpus):
    cmd = ["srun", "-N2", "--ntasks-per-node=2", "--gpus-per-node=2", "bash", "-c", ECHO]
    per_node = _rows(_ok(slurm_cluster.run(cmd, timeout=60)))
    assert per_node == {node: {0: "0,1", 1: "0,1"} for node in two_nodes}


def test_gpus_per_task_binds_one_gpu_each(slurm_cluster, two_nodes, gpus):
    cmd = ["srun", "-N2", "--ntasks-per-node=2", "--gpus-per-task=1", "bash", "-c", ECHO]
    per_node = _rows(_ok(slurm_cluster.run(cmd, timeout=60)))
    assert sorted(per_node) == two_nodes
    for node, tasks in per_node.items():
        assert sorted(tasks) == [0, 1], per_node
        assert all(cuda.isdigit() for cuda in tasks.values()), f"{node}: not one GPU per task: {tasks}"
        assert len(set(tasks.values())) == 2, f"{node}: local tasks share a GPU: {tasks}"


def test_impossible_request_is_rejected_readably(slurm_cluster):
    proc = slurm_cluster.run(["sbatch", "--test-only", "-N99", "--wrap", "true"], timeout=30)
    assert proc.returncode != 0
    message = (proc.stderr + proc.stdout).strip()
    # EnforcePartLimits=ALL (as on the sites) checks the partition first: 99 nodes x 1 CPU > its 2 x 2 CPUs
    assert "More processors requested than permitted" in message, message


def test_batch_job_output_and_states(slurm_cluster, two_nodes, tmp_path):
    # sbatch runs a copy of the script from the spool dir: files are found via $SLURM_SUBMIT_DIR
    (tmp_path / "input.txt").write_text("hello from the submit dir\n")
    script = tmp_path / "job.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH -N2 --ntasks-per-node=1 -o out-%j.txt\n"
        "set -euo pipefail\n"
        'cat "$SLURM_SUBMIT_DIR/input.txt"\n'
        'echo "nodes=$SLURM_JOB_NODELIST"\n'
        "srun hostname | sort\n"
    )
    job = slurm_cluster.sbatch(script)
    assert slurm_cluster.wait(job, timeout=60) == "COMPLETED", slurm_cluster.log_tail()
    out = (tmp_path / f"out-{job}.txt").read_text()
    lines = out.splitlines()
    assert lines[0] == "hello from the submit dir", out
    assert lines[1].startswith("nodes=node"), out
    hosts = lines[2:]
    assert len(hosts) == 2 and len(set(hosts)) == 2 and set(hosts) <= set(slurm_cluster.nodes), out

    bad = tmp_path / "bad.sbatch"
    bad.write_text("#!/bin/bash\n#SBATCH -o bad-%j.txt\necho about to fail\nexit 3\n")
    job = slurm_cluster.sbatch(bad)
    assert slurm_cluster.wait(job, timeout=60) == "FAILED"
    assert slurm_cluster.job_info(job)[0]["ExitCode"] == "3:0"
    assert (tmp_path / f"bad-{job}.txt").read_text() == "about to fail\n"


def test_sacct_records_a_finished_job(slurm_cluster, tmp_path):
    """testbed/README.md: with STB_ACCOUNTING=1 (the fixture's default) `sacct` works. slurmdbd stores a
    job's start and end asynchronously: polled for up to 60 s until the record has an end state."""
    if os.environ.get("STB_ACCOUNTING", "1") != "1":
        pytest.skip("the testbed was started without accounting (STB_ACCOUNTING=0)")
    bad = tmp_path / "exit4.sbatch"
    bad.write_text("#!/bin/bash\n#SBATCH -o /dev/null\nexit 4\n")
    job = slurm_cluster.sbatch(bad)
    assert slurm_cluster.wait(job, timeout=60) == "FAILED"
    cmd = ["sacct", "-n", "-X", "-P", "-j", job, "-o", "JobID,State,ExitCode"]
    for _ in range(60):
        rows = _ok(slurm_cluster.run(cmd, timeout=30)).split()
        # slurmdbd receives the job's start and end one after the other: PENDING, then RUNNING, then the end
        if rows and rows[0].split("|")[1] not in ("PENDING", "RUNNING"):
            break
        time.sleep(1)
    assert rows == [f"{job}|FAILED|4:0"], rows
