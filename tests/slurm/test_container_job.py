"""A real 2-node job on the SLURM testbed whose ranks run inside a container (the bubblewrap twin of
Singularity, tests/containers/twin, on the jobs' PATH), the way LUMI users run one: the older LUMI PyTorch
image generation (torch in a conda env that $WITH_CONDA activates) plus a venv made through it with
`exatrain container venv` on the LUMI-like /project/<project> (a link into /pfs), the job's files under
/scratch/<project> (also a link), the profile binding /pfs, /scratch, /project and /flash as LUMI's
bindings modules do. `exatrain submit` checks the image, then `exatrain run` starts a gloo script on 4 ranks
in srun mode. A second job, whose image lacks exatrain, fails within seconds with one HINT (rank 0's), no
traceback. Not reproduced: SIF, overlays, GPU binding, setuid starters (see the twin's docstring)."""

import shutil
import sys
import uuid
from pathlib import Path

import pytest

from tests.containers.images import session_images, session_venv, session_workspace, twin_env

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bubblewrap")]

PROFILE = """name = "twin-cpu"
gpu_vendor = "none"
gpus_per_node = 0
cores_per_node = 2
usable_cores = 2
default_cpus_per_gpu = 1
default_mem_per_gpu_gb = 0
partition = ""
visibility = "gpus-per-node"
cpu_masks = []
master_suffix = ""
node_local_tmp = "/tmp"
container_runtime = "singularity"
container_binds = [{binds}]
[comm_env]
[caches]
[[billing]]
rule = "gpu-hours"
units_per_gpu_hour = 1.0
"""
SCRIPT = """import os, sys
import torch, torch.distributed as dist
import exatrain
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
print(f"rank {dist.get_rank()}/{dist.get_world_size()} on {os.uname().nodename} sum {t.item():g} "
      f"python {sys.prefix} torch {torch.__file__} exatrain {exatrain.__file__}", flush=True)
dist.destroy_process_group()
"""


def _job_dir(image, venv=""):
    ws = session_workspace()
    job = ws["scratch"] / f"job-{uuid.uuid4().hex[:8]}"  # under the link /scratch/<project>
    job.mkdir()
    binds = ", ".join(f'"{ws[k]}"' for k in ("pfs_root", "scratch_root", "project_root", "flash_root"))
    (job / "twin.toml").write_text(PROFILE.format(binds=binds))
    (job / "gloo_script.py").write_text(SCRIPT)
    venv_line = f'container_venv = "{venv}"\n' if venv else ""
    (job / "job.toml").write_text(
        '[run]\ndir = "runs/exp"\n[job]\nnodes = 2\ngpus_per_node = 2\ntime = 5\nprofile = '
        f'"{job}/twin.toml"\n'
        f'container_image = "{image}"\n{venv_line}command = ["python", "gloo_script.py"]\n'
    )
    return job


def _cli(cluster, job, *args, path=None):
    return cluster.run(
        [sys.executable, "-m", "exatrain.cli.main", *args],
        cwd=job,
        env={"PATH": path or twin_env()["PATH"], "PYTHONPATH": ""},
        timeout=240,
    )


def test_two_node_gloo_job_in_the_older_lumi_image_with_its_venv(slurm_cluster):
    image, venv = session_images()["conda"], session_venv("conda")
    job = _job_dir(image, venv)
    r = _cli(slurm_cluster, job, "submit", "-c", "job.toml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"container: {image}: torch 2.13.0" in r.stderr and f"(venv {venv})" in r.stderr
    job_id = r.stdout.split("submitted job ")[1].split()[0]
    state = slurm_cluster.wait(job_id, timeout=300)
    log = Path(next(line.split("stdout  ", 1)[1] for line in r.stdout.splitlines() if "stdout  " in line))
    text = log.read_text() if log.is_file() else f"(no {log})"
    assert state == "COMPLETED", text
    lines = sorted(line for line in text.splitlines() if line.startswith("rank "))
    assert [line.split(" sum ")[0] for line in lines] == [
        "rank 0/4 on node1",
        "rank 1/4 on node1",
        "rank 2/4 on node2",
        "rank 3/4 on node2",
    ], text
    for line in lines:  # the image's torch, the venv's exatrain, all through the container
        assert " sum 10 " in line and f"python {venv}" in line, line
        assert "torch /opt/miniconda3/envs/pytorch/" in line and f"exatrain {venv}/lib/" in line, line


def test_rank_without_exatrain_fails_fast_with_one_hint(slurm_cluster):
    """The script as `exatrain sbatch` prints it where no container runtime is installed (a laptop: the image
    is not checked, as the note says), submitted by hand on the cluster, in an image without exatrain: every
    rank stops before Python starts the user's script; only rank 0 prints the error and its HINT."""
    image = session_images()["aif"]
    job = _job_dir(image)
    no_runtime = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    printed = _cli(slurm_cluster, job, "sbatch", "-c", "job.toml", path=no_runtime)
    assert printed.returncode == 0, printed.stderr
    assert "was not checked" in printed.stderr, printed.stderr
    (job / "runs").mkdir()
    (job / "by-hand.sh").write_text(printed.stdout)
    job_id = slurm_cluster.sbatch(
        job / "by-hand.sh", cwd=job, env={"PATH": twin_env()["PATH"], "PYTHONPATH": ""}
    )
    state = slurm_cluster.wait(job_id, timeout=180)
    text = (job / "runs" / f"exatrain-{job_id}.out").read_text()
    assert state == "FAILED", text
    assert text.count("HINT: create the venv once on a login node: exatrain container venv") == 1, text
    assert text.count(f"exatrain does not import inside the image {image}") == 1, text
    assert "Traceback" not in text and "rank 0/4" not in text, text
    assert "exited with exit code 97" in text.lower() or "exit code 97" in text.lower(), text
