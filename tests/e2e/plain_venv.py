"""A venv that holds what a plain ``pip install .`` gives (exatrain and its declared dependencies, no extra):
built in seconds and offline from the test venv's own installed distributions.

How: the closure of pyproject.toml's ``dependencies`` (markers evaluated, extras never followed) is taken
from the distributions installed in the running venv; their files (per each distribution's RECORD) are
linked into one folder that a ``.pth`` file puts on a fresh venv's path; exatrain itself is then installed
into the fresh venv by pip from a copy of what its wheel holds (``--no-deps --no-build-isolation``) and
``pip check`` proves every declared requirement is met by that folder alone. What it does not reproduce:
pip choosing the newest release of each dependency from PyPI (the versions are the test venv's).
"""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def core_closure() -> dict[str, md.Distribution]:
    """Installed distributions a plain install of exatrain needs: its dependencies and theirs, no extras."""
    todo = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    found: dict[str, md.Distribution] = {}
    while todo:
        req = Requirement(todo.pop())
        if req.marker and not req.marker.evaluate({"extra": ""}):
            continue
        if _key(req.name) in found:
            continue
        dist = md.distribution(req.name)
        found[_key(req.name)] = dist
        todo += dist.requires or []
    return found


def _owners() -> dict[tuple[str, ...], set[str]]:
    """Every path prefix inside site-packages -> the distributions with files under it."""
    owners: dict[tuple[str, ...], set[str]] = {}
    for dist in md.distributions():
        name = _key(dist.metadata["Name"])
        for f in dist.files or []:
            parts = Path(f).parts
            if parts and parts[0] != "..":
                for depth in range(1, len(parts) + 1):
                    owners.setdefault(parts[:depth], set()).add(name)
    return owners


def link_farm(folder: Path, dists: dict[str, md.Distribution]) -> None:
    """Link each file of ``dists`` into ``folder`` at the shallowest path no other distribution shares."""
    owners, wanted = _owners(), set(dists)
    for dist in dists.values():
        base = Path(dist.locate_file(""))
        for f in dist.files or []:
            parts = Path(f).parts
            if not parts or parts[0] == "..":
                continue
            depth = next(d for d in range(1, len(parts) + 1) if owners[parts[:d]] <= wanted)
            target = folder.joinpath(*parts[:depth])
            if not target.is_symlink() and (base / f).exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(base.joinpath(*parts[:depth]))


def make_plain_venv(folder: Path) -> Path:
    """The fresh venv (see the module docstring); returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder / "venv")], check=True)
    python = folder / "venv" / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    link_farm(folder / "deps", core_closure())
    Path(site, "plain_install_deps.pth").write_text(f"{folder / 'deps'}\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check", "-q"]
    # built from a copy of what the wheel holds, as `exatrain container venv` does: setuptools builds in the
    # source tree's build/, which another build at the same time (a SLURM test's) would break
    from exatrain.slurm.container_env import _COPY_SOURCE_PY, _SOURCE_FILES

    source = folder / "exatrain-src"
    subprocess.run(
        [sys.executable, "-c", _COPY_SOURCE_PY, str(ROOT), str(source), *_SOURCE_FILES], check=True
    )
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-build-isolation", "--no-cache-dir", str(source)],
        check=True,
        cwd=folder,
    )
    subprocess.run([*pip, "check"], check=True)
    return python
