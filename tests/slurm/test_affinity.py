"""CPU binding applied by SLURM for real: the testbed runs TaskPlugin=task/affinity, so the profile's masks
in exatrain's srun line (``--cpu-bind=mask_cpu:...``) reach the kernel, and exatrain's affinity table shows
the cores each rank really runs on (os.sched_getaffinity in every rank).

The profile below is written for this machine: 2 cores per node, 2 ranks per node, and its masks are
swapped on purpose (local rank 0 -> core 1, local rank 1 -> core 0), so the result cannot come from the
kernel's default order or from no binding at all (which would leave every rank on cores 0-1). The GPUs are
the testbed's fake gres GPUs; the ranks train on CPU."""

import pytest

from tests.slurm.test_submit import CONFIG, _submit

pytestmark = pytest.mark.slurm

PROFILE = """# The testbed's nodes with CPU masks that fit this machine's 2 cores (swapped: rank 0 -> core 1).
name = "testbed-bound"
gpu_vendor = "nvidia"
gpus_per_node = 2
cores_per_node = 2
usable_cores = 2
default_cpus_per_gpu = 1
default_mem_per_gpu_gb = 0
partition = ""
visibility = "gpus-per-node"
cpu_masks = ["0x2", "0x1"]
master_suffix = ""
node_local_tmp = "/tmp"
container_runtime = "apptainer"
[comm_env]
[caches]
[[billing]]
rule = "gpu-hours"
units_per_gpu_hour = 1.0
"""
MASK_CORE = {0: "1", 1: "0"}  # local rank -> the core its mask (above) names


def _table(log: str) -> dict[int, list[str]]:
    """exatrain's affinity table from the job log: rank -> [host, GPU, expected, actual, verdict...]."""
    lines = log.split("CPU affinity (profile ", 1)[1].splitlines()[2:]
    rows = {}
    for line in lines:
        words = line.split()
        if not words or not words[0].isdigit():
            break
        rows[int(words[0])] = words[1:]
    return rows


def test_srun_mask_cpu_is_applied_and_shown(slurm_cluster, tmp_path):
    profile = tmp_path / "testbed-bound.toml"
    profile.write_text(PROFILE)
    config = tmp_path / "job.toml"
    config.write_text(CONFIG.format(profile=profile, launch="srun"))
    run_dir = tmp_path / "runs" / "bound"
    # strict: a rank whose affinity is not its mask fails the job
    job, state, _, log = _submit(
        slurm_cluster,
        tmp_path,
        str(config),
        f"--run.dir={run_dir}",
        "--dist.affinity=strict",
        "--train.steps=2",
    )
    assert "--cpu-bind=mask_cpu:0x2,0x1" in (tmp_path / "runs" / "bound.sbatch").read_text()
    assert state == "COMPLETED", log
    table = _table(log)
    assert sorted(table) == [0, 1, 2, 3], log
    for rank, (host, _gpu, expected, actual, verdict, *_) in table.items():
        core = MASK_CORE[rank % 2]
        assert (host, expected, actual, verdict) == (f"node{rank // 2 + 1}", core, core, "ok"), log
    assert "MISMATCH" not in log
