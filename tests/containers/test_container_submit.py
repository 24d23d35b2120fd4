"""`exatrain submit --dry-run` of a container job checks the image through the runtime (the container twin,
tests/containers/twin) before anything is queued, on both LUMI image generations: the AI Factory-like image
started with `run` plus a venv made by `exatrain container venv` passes and prints torch's and exatrain's
versions; the older conda-like image without a venv fails with a HINT naming the image and the command that
fixes it (its torch imported: $WITH_CONDA ran); an image without torch, a bind path or a venv that does not
exist fail with a HINT. The twin does not reproduce SIF files, overlays, GPU binding or setuid starters."""

import shutil
import subprocess
import sys

import pytest

from tests.containers.images import session_images, session_venv, session_workspace, twin_env

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

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


def _submit(tmp_path, job: str, binds=()):
    profile = tmp_path / "twin.toml"
    profile.write_text(PROFILE.format(binds=", ".join(f'"{b}"' for b in binds)))
    cfg = tmp_path / "job.toml"
    cfg.write_text(f'[run]\ndir = "{tmp_path}/runs/exp"\n[job]\nprofile = "{profile}"\ntime = 5\n{job}\n')
    return subprocess.run(
        [sys.executable, "-m", "exatrain.cli.main", "submit", "--dry-run", "-c", str(cfg)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=twin_env(),
        timeout=180,
    )


def _lumi_binds():
    ws = session_workspace()
    return [ws["pfs_root"], ws["scratch_root"], ws["project_root"], ws["flash_root"]]


def test_ai_factory_image_with_its_venv_passes(tmp_path):
    image, venv = session_images()["aif"], session_venv("aif")
    r = _submit(
        tmp_path,
        f'container_image = "{image}"\ncontainer_venv = "{venv}"\ncontainer_start = "run"',
        _lumi_binds(),
    )
    assert r.returncode == 0, r.stderr
    assert f"container: {image}: torch 2.13.0" in r.stderr and f"exatrain 0.1.0 (venv {venv})" in r.stderr
    assert "singularity run --bind=" in r.stdout.replace("'", "") and f". {venv}/bin/activate" in r.stdout


def test_older_image_without_venv_names_the_fix(tmp_path):
    image = session_images()["conda"]
    r = _submit(tmp_path, f'container_image = "{image}"')
    assert r.returncode == 2 and not r.stdout
    assert f"exatrain does not import in the image (no job.container_venv set) with image {image}" in r.stderr
    assert "HINT: create the venv once: exatrain container venv --runtime=singularity" in r.stderr
    assert str(image) in r.stderr.split("HINT:")[1]


def test_image_without_torch_is_refused(tmp_path):
    image = session_images()["notorch"]
    r = _submit(tmp_path, f'container_image = "{image}"\ncontainer_start = "run"')
    assert r.returncode == 2
    assert f"the Python of image {image} does not import torch" in r.stderr and "HINT:" in r.stderr


def test_missing_bind_and_missing_venv_are_refused(tmp_path):
    image = session_images()["aif"]
    r = _submit(tmp_path, f'container_image = "{image}"\ncontainer_binds = ["/no/such/data"]')
    assert r.returncode == 2 and "container bind path(s) /no/such/data do not exist here" in r.stderr
    assert "HINT:" in r.stderr
    venv = session_workspace()["project"] / "never-made"
    r = _submit(tmp_path, f'container_image = "{image}"\ncontainer_venv = "{venv}"')
    assert r.returncode == 2 and f"job.container_venv {venv} does not exist" in r.stderr
    assert (
        "HINT: create it once through the image: exatrain container venv --runtime=singularity "
        f"{image} {venv}" in r.stderr
    )


def test_symlinked_rank_paths_are_bound_by_both_names(tmp_path):
    """data.path under LUMI's /scratch/<project> (a link into /pfs): the job binds the link's name, which the
    ranks use, and its target."""
    ws = session_workspace()
    data = ws["scratch"] / "corpus"
    data.mkdir(exist_ok=True)
    image, venv = session_images()["aif"], session_venv("aif")
    r = _submit(
        tmp_path,
        f'container_image = "{image}"\ncontainer_venv = "{venv}"\ncontainer_start = "run"\n'
        f'[data]\npath = "{data}"',
    )
    assert r.returncode == 0, r.stderr
    binds = r.stdout.replace("'", "").split("--bind=")[1].split()[0].split(",")
    assert str(data) in binds and str(data.resolve()) in binds and str(data) != str(data.resolve())
