"""The ranks' entry inside a container image (exatrain.slurm.container_env), run here by bash without a
container: $WITH_CONDA and the job's venv are activated, a rank whose Python cannot import exatrain exits
97 at once and only rank 0 prints the error and the HINT with the fixing command; with exatrain importable
it becomes the command. Plus the job spec's container_start check and the binds of symlinked paths."""

import dataclasses
import subprocess
import sys

import pytest

from exatrain.config import load_config
from exatrain.errors import ConfigError
from exatrain.slurm import JobSpec
from exatrain.slurm.container_env import EXIT_NO_EXATRAIN, entry_words
from exatrain.slurm.containers import rank_paths

NO_EXATRAIN_PATH = "/usr/bin:/bin"  # Debian's python3: no exatrain


def _entry(venv="", rank="0", path=NO_EXATRAIN_PATH, with_conda=""):
    words = entry_words("singularity", "/img/pt.sif", venv, ("/pfs",)) + ["echo", "started"]
    env = {"PATH": path, "SLURM_PROCID": rank, "WITH_CONDA": with_conda, "HOME": "/tmp"}
    return subprocess.run(words, capture_output=True, text=True, env=env, timeout=60, cwd="/tmp")


def test_rank_zero_alone_prints_the_hint():
    zero, one = _entry(rank="0"), _entry(rank="1")
    assert zero.returncode == one.returncode == EXIT_NO_EXATRAIN
    assert "exatrain does not import inside the image /img/pt.sif" in zero.stderr
    assert zero.stderr.count("HINT:") == 1
    assert "exatrain container venv --runtime=singularity --bind=/pfs /img/pt.sif VENV" in zero.stderr
    assert one.stderr == "" and "started" not in zero.stdout + one.stdout


def test_missing_venv_is_named(tmp_path):
    r = _entry(venv=str(tmp_path / "gone"))
    assert r.returncode == EXIT_NO_EXATRAIN and f"the venv {tmp_path / 'gone'} is not visible" in r.stderr


def test_venv_and_with_conda_are_activated(tmp_path):
    """The venv's activate puts a python3 with exatrain first on PATH; $WITH_CONDA runs before it."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # this venv's Python
    (venv / "bin" / "python3").chmod(0o755)
    (venv / "bin" / "activate").write_text(f"export PATH={venv}/bin:$PATH\n")
    conda = tmp_path / "conda-activate"
    conda.write_text(f"echo conda-activated > {tmp_path}/mark\n")
    r = _entry(venv=str(venv), with_conda=f"source {conda}")
    assert r.returncode == 0 and r.stdout == "started\n", r.stderr
    assert (tmp_path / "mark").read_text() == "conda-activated\n"


def test_container_start_is_exec_or_run():
    spec = JobSpec.from_dict({"container_image": "/i.sif", "container_start": "run"})
    assert spec.container_start == "run"
    with pytest.raises(ConfigError, match="container_start"):
        dataclasses.replace(spec, container_start="shell")


def test_symlinked_paths_are_bound_by_both_names(tmp_path):
    real = tmp_path / "pfs" / "scratch" / "p"
    (real / "data").mkdir(parents=True)
    (tmp_path / "scratch").mkdir()
    (tmp_path / "scratch" / "p").symlink_to(real)
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[data]\npath = "{tmp_path}/scratch/p/data"\n[job]\ncontainer_venv = "{tmp_path}/scratch/p/venv"\n'
    )
    binds = rank_paths(load_config(str(cfg), []), tmp_path / "runs" / "x", tmp_path)
    assert {f"{tmp_path}/scratch/p/data", str(real / "data"), f"{tmp_path}/scratch/p", str(real)} <= set(
        binds
    )


def test_the_venv_is_built_from_a_copy_that_holds_the_whole_wheel(tmp_path):
    """`exatrain container venv` from a checkout pip-installs a copy of what its wheel needs (made in the new
    venv, removed after), never the clone itself: setuptools builds in the source tree's build/, which a
    second build at the same time or an interrupted earlier one breaks ("File exists"; CI saw it). The copy
    is made here with the script's own snippet and built into a wheel that holds the site profiles."""
    import shlex
    import zipfile

    from exatrain.slurm.container_env import _COPY_SOURCE_PY, _SOURCE_FILES, source_spec, venv_command

    script = venv_command("singularity", "/img/pt.sif", str(tmp_path / "v"), "exec", (), ())[-1]
    root = source_spec()
    assert root.startswith("/") and f"{tmp_path}/v/.exatrain-src" in script
    install = next(line for line in script.splitlines() if "pip install" in line)
    assert shlex.split(install)[-1] == f"{tmp_path}/v/.exatrain-src" and root not in install
    assert script.splitlines()[-1] == f"rm -rf {tmp_path}/v/.exatrain-src"
    copy = tmp_path / "src"
    subprocess.run([sys.executable, "-c", _COPY_SOURCE_PY, root, str(copy), *_SOURCE_FILES], check=True)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(copy),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    names = zipfile.ZipFile(next(tmp_path.glob("exatrain-*.whl"))).namelist()
    assert "exatrain/slurm/profiles/lumi-g.toml" in names and "exatrain/cli/main.py" in names
