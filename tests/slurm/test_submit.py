"""`exatrain submit` on the real SLURM testbed (2 nodes, 2 cores and fake gres GPUs each): the reference
workload in both launch modes, rank -> GPU mapping under --gpus-per-task and --gpus-per-node, hostile job
names and paths, a job array, `--test-only` rejecting an impossible request, and a wrong master address
failing fast. Every job is the generated script, unedited; the ranks train a tiny model for 8 steps."""

import json
import os
import sys
from pathlib import Path

import pytest

from exatrain.config import load_config

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
PROFILE = """# The testbed's nodes: 2 cores, fake NVIDIA GPUs (gres), no site presets.
name = "testbed"
gpu_vendor = "nvidia"
gpus_per_node = 2
cores_per_node = 2
usable_cores = 2
default_cpus_per_gpu = 1
default_mem_per_gpu_gb = 0
partition = ""
visibility = "{visibility}"
cpu_masks = []
master_suffix = ""
node_local_tmp = "/tmp"
container_runtime = "apptainer"
[comm_env]
[caches]
TORCHINDUCTOR_CACHE_DIR = "inductor"
[[billing]]
rule = "gpu-hours"
units_per_gpu_hour = 1.0
"""
CONFIG = """[job]
nodes = 2
time = 10
profile = "{profile}"
launch = "{launch}"
[job.env]
OMP_NUM_THREADS = "1"
[train]
steps = 8
log_every = 4
eval_every = 0
eval_batches = 2
eval_at_start = false
global_batch_size = 8
micro_batch_size = 2
save_model = false
[data]
seq_len = 16
"""


def _exatrain(cluster, *args, cwd, env=None):
    """The real CLI with the cluster's SLURM_CONF; the venv's bin on PATH, as on a login node after
    activating it (the job inherits it: `exatrain`, `torchrun` and `python3` are found there); ``env`` on
    top."""
    env = {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        **(env or {}),
    }
    return cluster.run([sys.executable, "-m", "exatrain.cli.main", *args], cwd=cwd, env=env, timeout=120)


def _job_toml(tmp_path, launch="srun", visibility="gpus-per-task"):
    profile = tmp_path / f"testbed-{visibility}.toml"
    profile.write_text(PROFILE.format(visibility=visibility))
    config = tmp_path / "job.toml"
    config.write_text(CONFIG.format(profile=profile, launch=launch))
    return config


def _submit(cluster, tmp_path, *args, timeout=420):
    """Submit, wait, return (job id, final state, the submit command's stdout, the job's stdout)."""
    r = _exatrain(cluster, "submit", "-c", *args, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    job = r.stdout.split("submitted job ")[1].split()[0]
    state = cluster.wait(job, timeout=timeout)
    out_path = next(line.split("stdout  ", 1)[1] for line in r.stdout.splitlines() if "stdout  " in line)
    log = Path(out_path)
    return job, state, r.stdout, log.read_text() if log.is_file() else f"(no {log})"


def _ranks(run_dir, world=4):
    return [json.loads((run_dir / "ranks" / f"rank-{r}.json").read_text()) for r in range(world)]


def _finished(run_dir, world=4):
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 8 and summary["world_size"] == world and summary["weights_in_sync"]


def test_srun_gpus_per_task_with_hostile_name_and_path(slurm_cluster, tmp_path):
    """One task per GPU; each rank sees only its own GPU (device 0). Job name and run directory carry
    quotes, `$()` and spaces: rendered quoted, run literally, nothing executed."""
    hostile = "a'b\"c $(touch pwned) d"  # no slash: %x of the output pattern becomes part of a file name
    run_dir = tmp_path / "runs $(touch pwned) it's" / "exp 1"
    config = _job_toml(tmp_path)
    job, state, submitted, log = _submit(
        slurm_cluster, tmp_path, str(config), f"--run.dir={run_dir}", f"--job.name={hostile}"
    )
    assert state == "COMPLETED", log
    assert f"exatrain job {job} ({hostile})" in log, log
    assert "no nvidia-smi found; skipping" in log  # the GPU smoke test ran (and found no tool on the testbed)
    assert "WARNING" not in log, log  # SLURM's own CUDA+ROCR binding on an NVIDIA-like node is not a problem
    assert Path(run_dir.parent / "exp 1.sbatch").is_file()
    assert not list(tmp_path.rglob("pwned")), "a $() in a name or path was executed"
    _finished(run_dir)
    ranks = _ranks(run_dir)
    assert [(r["kind"], r["global_rank"], r["hostname"], r["local_rank"]) for r in ranks] == [
        ("slurm", 0, "node1", 0),
        ("slurm", 1, "node1", 1),
        ("slurm", 2, "node2", 0),
        ("slurm", 3, "node2", 1),
    ]
    assert [r["gpu"]["visibility"]["CUDA_VISIBLE_DEVICES"] for r in ranks] == [["0"], ["1"], ["0"], ["1"]]
    assert [r["gpu"]["device"] for r in ranks] == ["cuda:0"] * 4


@pytest.mark.parametrize("launch", ["srun", "torchrun"])
def test_gpus_per_node_indexes_by_local_rank(slurm_cluster, tmp_path, launch):
    """srun with every GPU of the node visible to every rank, and torchrun (one task per node, c10d
    rendezvous on the first node): rank i of a node uses GPU i. The srun case submits the script that
    `exatrain sbatch` prints with plain sbatch: the script alone (it writes the ranks' config) is a job."""
    config = _job_toml(tmp_path, launch=launch, visibility="gpus-per-node")
    run_dir = tmp_path / "runs" / launch
    if launch == "torchrun":
        job, state, _, log = _submit(slurm_cluster, tmp_path, str(config), f"--run.dir={run_dir}")
    else:
        printed = _exatrain(slurm_cluster, "sbatch", "-c", str(config), f"--run.dir={run_dir}", cwd=tmp_path)
        assert printed.returncode == 0, printed.stderr
        assert f"does not create the output directory {tmp_path / 'runs'}" in printed.stderr
        (tmp_path / "runs").mkdir()
        (tmp_path / "by-hand.sh").write_text(printed.stdout)
        job = slurm_cluster.sbatch(
            tmp_path / "by-hand.sh",
            cwd=tmp_path,
            env={"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)},
        )
        state = slurm_cluster.wait(job, timeout=420)
        log = (tmp_path / "runs" / f"exatrain-{job}.out").read_text()
    assert state == "COMPLETED", log
    _finished(run_dir)
    ranks = _ranks(run_dir)
    kind = "torchelastic" if launch == "torchrun" else "slurm"
    assert [(r["kind"], r["hostname"], r["local_rank"], r["node_rank"]) for r in ranks] == [
        (kind, "node1", 0, 0),
        (kind, "node1", 1, 0),
        (kind, "node2", 0, 1),
        (kind, "node2", 1, 1),
    ]
    assert all(r["gpu"]["visibility"]["CUDA_VISIBLE_DEVICES"] == ["0", "1"] for r in ranks)
    assert [r["gpu"]["device"] for r in ranks] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    if launch == "torchrun":
        assert "rendezvous at node1:" in log and ranks[0]["job_id"] == job


def test_job_array_of_two_runs(slurm_cluster, tmp_path):
    """`--array train.seed=1,2`: two array tasks (one node each), each in its own run dir with its seed."""
    config = _job_toml(tmp_path)
    run_dir = tmp_path / "runs" / "sweep"
    job, state, submitted, _ = _submit(
        slurm_cluster,
        tmp_path,
        str(config),
        f"--run.dir={run_dir}",
        "--job.nodes=1",
        "--array",
        "train.seed=1,2",
    )
    assert "2 array tasks" in submitted
    assert state == "COMPLETED", [p.read_text() for p in (tmp_path / "runs").glob("*.out")]
    for task, seed in enumerate((1, 2)):
        _finished(run_dir / f"array-{task}", world=2)
        used = load_config(str(run_dir / f"array-{task}" / "config.toml"))  # what the task trained with
        assert used.train.seed == seed and used.run.dir == str(run_dir / f"array-{task}")
    assert len(list((tmp_path / "runs").glob("exatrain-*.out"))) == 2  # one output file per task


def test_test_only_rejects_impossible_request(slurm_cluster, tmp_path):
    config = _job_toml(tmp_path)
    ok = _exatrain(
        slurm_cluster, "submit", "-c", str(config), "--test-only", f"--run.dir={tmp_path}/r", cwd=tmp_path
    )
    assert ok.returncode == 0 and "SLURM would accept it: Job" in ok.stdout, ok.stdout + ok.stderr
    r = _exatrain(
        slurm_cluster,
        "submit",
        "-c",
        str(config),
        "--test-only",
        "--job.nodes=99",
        f"--run.dir={tmp_path}/r",
        cwd=tmp_path,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "exatrain: error: SLURM would not schedule the job:" in r.stderr and "HINT:" in r.stderr
    assert "job.nodes" in r.stderr.split("HINT:")[1], r.stderr  # the reason mapped to what to change
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "r.sbatch").exists()  # nothing written, nothing queued


def test_master_set_to_own_hostname_on_every_node(slurm_cluster, tmp_path):
    """`MASTER_ADDR=$(hostname)` evaluated in every task (what job scripts do where scontrol is missing in a
    container): the second node's ranks stop at once with the HINT; the first node's ranks (whose master is
    right) stop at the join timeout naming the ranks that never checked in, instead of hanging."""
    config = _job_toml(tmp_path)
    run_dir = tmp_path / "runs" / "own"
    rank = [
        "bash",
        "-c",
        'export MASTER_ADDR=$(hostname); exec exatrain train "$@"',
        "rank",
        f"--config={run_dir.parent / 'own.toml'}",
        f"--run.dir={run_dir}",
    ]
    job, state, _, log = _submit(
        slurm_cluster,
        tmp_path,
        str(config),
        f"--run.dir={run_dir}",
        f"--job.command={json.dumps(rank)}",
        "--dist.timeout_s=15",
        timeout=180,
    )
    assert state == "FAILED", log
    assert log.count("is this node's own host name, but rank") == 2 and "HINT: unset MASTER_ADDR" in log, log
    assert "2 of 4 ranks never checked in: 2-3" in log, log
    assert "Traceback" not in log


def test_status_and_cancel(slurm_cluster, tmp_path):
    config = _job_toml(tmp_path)
    r = _exatrain(
        slurm_cluster,
        "submit",
        "-c",
        str(config),
        "--job.nodes=1",
        '--job.command=["sleep", "300"]',
        f"--run.dir={tmp_path}/runs/sleep",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    job = r.stdout.split("submitted job ")[1].split()[0]
    status = _exatrain(slurm_cluster, "status", job, cwd=tmp_path)
    assert (
        status.returncode == 0
        and job in status.stdout
        and ("PENDING" in status.stdout or "RUNNING" in status.stdout)
    )
    cancel = _exatrain(slurm_cluster, "cancel", job, cwd=tmp_path)
    assert cancel.returncode == 0 and f"cancelled job {job}" in cancel.stdout, cancel.stderr
    assert slurm_cluster.wait(job, timeout=60) == "CANCELLED"


def test_wrong_master_fails_within_seconds(slurm_cluster, tmp_path):
    """A 2-node job whose master address does not resolve (wrong site suffix) stops at once with a HINT
    instead of waiting dist.timeout_s (300 s) for a rendezvous that can never happen."""
    config = _job_toml(tmp_path)
    job, state, _, log = _submit(
        slurm_cluster,
        tmp_path,
        str(config),
        f"--run.dir={tmp_path}/runs/bad",
        "--dist.master_suffix=xyz",
        "--dist.timeout_s=300",
        timeout=240,
    )
    assert state == "FAILED", log
    # failed at the master check, not at the end of the 300 s join timeout (whose error reads otherwise)
    assert "cannot resolve the master host 'node1xyz'" in log and "HINT:" in log, log
    assert "could not join" not in log and "could not reach the master" not in log, log
    assert "Traceback" not in log
    status = _exatrain(slurm_cluster, "status", job, cwd=tmp_path)
    assert status.returncode == 0 and "FAILED" in status.stdout, status.stdout + status.stderr
