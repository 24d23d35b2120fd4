"""scripts/install.sh returns at once when the venv already has exatrain with the requested extras from the
same pyproject.toml, and installs otherwise. The venv is a stand-in (a `.venv/bin` of stub `pip`, `python` and
`exatrain` that only record their calls), since a real one costs a torch install; the script is the real
one."""

import shutil
import subprocess

import pytest

from tests.conftest import ROOT

STUB = '#!/bin/bash\necho "$(basename "$0") $*" >> "$(dirname "$0")/calls"\n'


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "scripts").mkdir()
    for name in ("scripts/install.sh", "scripts/build_horovod.sh", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("pip", "python", "exatrain"):
        (bin_dir / tool).write_text(STUB)
        (bin_dir / tool).chmod(0o755)
    return tmp_path


def _install(repo, extras):
    r = subprocess.run(
        ["bash", "scripts/install.sh", extras], cwd=repo, capture_output=True, text=True, timeout=60
    )
    calls = repo / ".venv" / "bin" / "calls"
    return r, calls.read_text() if calls.exists() else ""


def _installed(repo, extras):
    """A first, real run of the script over the stub venv (it records what it installed); the calls are
    cleared."""
    r, calls = _install(repo, extras)
    assert r.returncode == 0 and "pip install" in calls, r.stdout + r.stderr
    (repo / ".venv" / "bin" / "calls").unlink()


def test_installed_extras_are_not_installed_again(repo):
    _installed(repo, "test,examples,deepspeed")
    r, calls = _install(repo, "test,examples")
    assert r.returncode == 0 and "already installed" in r.stdout, r.stdout + r.stderr
    assert calls == "", "nothing may run pip (or anything else of the venv)"


@pytest.mark.parametrize(
    "before", ["test", None, "changed"], ids=["an extra missing", "no stamp", "other pyproject"]
)
def test_anything_else_installs(repo, before):
    if before == "test":
        _installed(repo, "test")
    if before == "changed":
        _installed(repo, "test,examples")
        (repo / "pyproject.toml").write_text((repo / "pyproject.toml").read_text() + "\n# changed\n")
    r, calls = _install(repo, "test,examples")
    assert "already installed" not in r.stdout
    assert "pip install -q --disable-pip-version-check -e .[test,examples]" in calls, calls + r.stderr
