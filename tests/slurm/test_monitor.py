"""`exatrain monitor JOBID` on the real SLURM test cluster: srun --overlap attaches to a running 2-node job.

The testbed's GPUs are fake (no GPU here): a stand-in `nvidia-smi` on PATH (srun passes PATH on to the
tasks) answers the monitor's query with the node's own name in the GPU name, so the table shows that
each row came from the node it names.
"""

import sys

import pytest

pytestmark = pytest.mark.slurm

STAND_IN = """#!/bin/sh
# stand-in nvidia-smi (fake GPUs in the testbed): two GPUs named after this node
n=$(hostname | tr -dc 0-9)
echo "0, FakeGPU-$(hostname), $((n * 10)), 2048, 81920, 250, 40"
echo "1, FakeGPU-$(hostname), $((n * 10 + 5)), 4096, 81920, 260, 41"
"""


def test_monitor_shows_every_gpu_of_a_running_job(slurm_cluster, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(STAND_IN)
    (bin_dir / "nvidia-smi").chmod(0o755)
    job = slurm_cluster.run(
        ["sbatch", "--parsable", "-N2", "--ntasks-per-node=1", "-o", "/dev/null", "--wrap", "sleep 600"],
        cwd=tmp_path,
        check=True,
    ).stdout.strip()
    try:
        assert _wait_running(slurm_cluster, job)
        env = {"PATH": f"{bin_dir}:{slurm_cluster.env['PATH']}", "COLUMNS": "200"}
        r = slurm_cluster.run(
            [sys.executable, "-m", "exatrain.cli.main", "monitor", job, "--once"], env=env, timeout=180
        )
        assert r.returncode == 0, r.stdout + r.stderr
        print(r.stdout)  # the README shows this table
        rows = [line.split("│") for line in r.stdout.splitlines() if "FakeGPU" in line]
        cells = [[c.strip() for c in row[1:-1]] for row in rows]
        assert [(c[0], c[1], c[2], c[3]) for c in cells] == [
            ("node1", "0", "FakeGPU-node1", "10"),
            ("node1", "1", "FakeGPU-node1", "15"),
            ("node2", "0", "FakeGPU-node2", "20"),
            ("node2", "1", "FakeGPU-node2", "25"),
        ]
        assert f"job {job}: 4 GPU(s) on 2 node(s)" in r.stdout
        assert cells[1][4] == "4.0 / 80.0"  # memory GiB used / total
    finally:
        slurm_cluster.run(["scancel", job])
    # a job that is not running is named, with a HINT
    r = slurm_cluster.run([sys.executable, "-m", "exatrain.cli.main", "monitor", "999999", "--once"])
    assert r.returncode == 2 and "job 999999" in r.stderr and "HINT:" in r.stderr


def _wait_running(cluster, job, timeout=300) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cluster.state(job) == "RUNNING":
            return True
        time.sleep(1)
    return False
