"""The container twin (twin/singularity on bubblewrap) behaves as Singularity/Apptainer does where exatrain's
jobs depend on it: only default and --bind paths are visible, a missing bind source fails, symlinked
workspace paths resolve only where their target is bound too, SINGULARITYENV_/APPTAINERENV_ reach the
inside only and without prefix, the host environment passes (PATH excepted), `run` runs the runscript,
and the older-generation image's torch environment exists only after $WITH_CONDA. What the twin does not
reproduce is listed in twin/singularity's docstring (SIF, overlays, GPU binding, setuid starters, ...).
Nothing here imports torch inside (fast)."""

import shutil
import subprocess

import pytest

from tests.containers.images import TWIN_BIN, session_images, session_workspace, twin_env

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


def _sing(*args, env=None, runtime="singularity"):
    return subprocess.run(
        [str(TWIN_BIN / runtime), *map(str, args)],
        capture_output=True,
        text=True,
        env=twin_env(env),
        cwd="/tmp",
        timeout=60,
    )


def _sh(image, script, *binds, env=None, mode="exec", runtime="singularity"):
    return _sing(mode, *[f"--bind={b}" for b in binds], image, "bash", "-c", script, env=env, runtime=runtime)


def test_only_default_and_bound_paths_are_visible(tmp_path):
    image, ws = session_images()["aif"], session_workspace()
    (tmp_path / "in-tmp").write_text("x")
    probe = (
        f"test -e {tmp_path}/in-tmp && echo tmp; test -e {ws['pfs_root']} && echo pfs; test -e /work "
        "&& echo work"
    )
    assert _sh(image, probe).stdout.split() == [
        "tmp"
    ]  # /tmp is a default bind; the workspace and /work are not
    assert _sh(image, probe, ws["pfs_root"]).stdout.split() == ["tmp", "pfs"]
    out = _sh(image, probe, env={"APPTAINER_BIND": str(ws["pfs_root"])}, runtime="apptainer")
    assert out.stdout.split() == ["tmp", "pfs"], out.stderr


def test_missing_bind_source_fails_like_the_runtime():
    r = _sh(session_images()["aif"], "echo started", "/no/such/dir")
    assert r.returncode == 255 and "started" not in r.stdout
    assert "mount source /no/such/dir doesn't exist" in r.stderr


def test_symlinked_workspace_resolves_only_with_its_target_bound():
    """LUMI's /scratch/<project> is a link into /pfs/...: bound by the link's folder alone it dangles."""
    image, ws = session_images()["aif"], session_workspace()
    (ws["scratch"] / "data.txt").write_text("corpus")
    read = f"cat {ws['scratch']}/data.txt"
    assert _sh(image, read, ws["scratch_root"]).returncode != 0
    assert _sh(image, read, ws["scratch_root"], ws["pfs_root"]).stdout == "corpus"
    # the link bound by its own name (the source is resolved, the destination keeps the name)
    assert _sh(image, read, ws["scratch"]).stdout == "corpus"


def test_environment_passes_and_prefixed_variables_are_stripped():
    script = 'echo "$HOSTVAR|$NAME|${SINGULARITYENV_NAME-unset}|$WIN|$PATH"'
    env = {
        "HOSTVAR": "h",
        "SINGULARITYENV_NAME": "inside",
        "SINGULARITYENV_WIN": "s",
        "APPTAINERENV_WIN": "a",
        "NAME": "host",
    }
    host, name, prefixed, win, path = _sh(session_images()["aif"], script, env=env).stdout.strip().split("|")
    assert (host, name, prefixed, win) == ("h", "inside", "unset", "a")
    assert path.startswith("/opt/venv/bin:") and str(TWIN_BIN) not in path  # the host PATH does not pass


def test_run_executes_the_runscript_and_exec_the_command(tmp_path):
    image = tmp_path / "tiny.sif"
    (image / ".singularity.d" / "env").mkdir(parents=True)
    (image / ".singularity.d" / "env" / "90-environment.sh").write_text("export FROM_IMAGE=yes\n")
    (image / ".singularity.d" / "runscript").write_text('#!/bin/bash\necho "runscript($FROM_IMAGE): $*"\n')
    (image / ".singularity.d" / "runscript").chmod(0o755)
    assert _sing("run", image, "a", "b").stdout == "runscript(yes): a b\n"
    assert _sing("exec", image, "bash", "-c", 'echo "exec($FROM_IMAGE)"').stdout == "exec(yes)\n"


def test_older_image_needs_with_conda():
    image = session_images()["conda"]
    prefix = "python3 -c 'import sys; print(sys.prefix)'"
    assert _sh(image, prefix).stdout.strip() == "/usr"  # the OS's Python: no torch there
    assert _sh(image, "$WITH_CONDA; " + prefix).stdout.strip() == "/opt/miniconda3/envs/pytorch"
    # $WITH_CONDA is harmless where an image does not set it
    assert _sh(session_images()["aif"], "$WITH_CONDA; " + prefix).stdout.strip() == "/opt/venv"
