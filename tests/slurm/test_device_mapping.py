"""Rank -> GPU mapping under real `srun` with gres GPUs (fake device files: SLURM sets the visibility
variables per task exactly as on a real cluster; torch is not involved, `exatrain env` decides)."""

import json
import sys

import pytest

pytestmark = pytest.mark.slurm


def _env_per_rank(cluster, tmp_path, *srun_flags):
    # one output file per task (%t): the ranks' stdout would interleave
    cmd = [
        "srun",
        "-N2",
        "--ntasks-per-node=2",
        f"--output={tmp_path}/env-%t.json",
        *srun_flags,
        sys.executable,
        "-m",
        "exatrain.cli.main",
        "env",
        "--json",
    ]
    r = cluster.run(cmd, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return [json.loads((tmp_path / f"env-{t}.json").read_text()) for t in range(4)]


def test_gpus_per_task_gives_each_rank_its_own_device_zero(slurm_cluster, tmp_path):
    ranks = _env_per_rank(slurm_cluster, tmp_path, "--gpus-per-task=1")
    assert [(d["kind"], d["hostname"], d["local_rank"]) for d in ranks] == [
        ("slurm", "node1", 0),
        ("slurm", "node1", 1),
        ("slurm", "node2", 0),
        ("slurm", "node2", 1),
    ]
    # SLURM narrowed visibility to one GPU per task: indexing by local rank would be out of range
    assert [d["device"] for d in ranks] == ["cuda:0"] * 4
    assert [d["visibility"]["CUDA_VISIBLE_DEVICES"] for d in ranks] == [["0"], ["1"], ["0"], ["1"]]


def test_gpus_per_node_indexes_by_local_rank(slurm_cluster, tmp_path):
    ranks = _env_per_rank(slurm_cluster, tmp_path, "--gpus-per-node=2")
    assert [d["device"] for d in ranks] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    assert all(d["visibility"]["CUDA_VISIBLE_DEVICES"] == ["0", "1"] for d in ranks)
    assert all(d["world_size"] == 4 and d["main_address"] == "node1" for d in ranks)
    assert len({d["main_port"] for d in ranks}) == 1


def test_batch_shell_is_not_rank_zero(slurm_cluster, tmp_path):
    """The sbatch script itself (no srun) sees SLURM_NTASKS=4 and SLURM_PROCID=0 but is no job step."""
    script = tmp_path / "shell.sbatch"
    script.write_text(
        f"#!/bin/bash\n#SBATCH -N2 --ntasks-per-node=2 -o shell.out\n"
        f"{sys.executable} -m exatrain.cli.main env --json > $SLURM_SUBMIT_DIR/shell.json\n"
    )
    job = slurm_cluster.sbatch(script, cwd=tmp_path)
    assert slurm_cluster.wait(job, timeout=120) == "COMPLETED"
    info = json.loads((tmp_path / "shell.json").read_text())
    assert info["kind"] == "local" and info["world_size"] == 1 and info["job_id"] == job
    assert any("srun" in note for note in info["notes"])
