"""Image trees for the container twin (twin/singularity), shaped like LUMI's two image generations.

- ``aif``: like the LUMI AI Factory images (/appl/local/laifs/containers/...): a venv at /opt/venv, already
  on PATH through the image's environment, started with `singularity run` (its runscript runs the
  arguments).
- ``conda``: like the older LUMI PyTorch images (/appl/local/containers/sif-images/...): a conda
  environment at /opt/miniconda3/envs/pytorch that ``$WITH_CONDA`` (set by the image) activates; without it
  `python` is the OS's, which has no torch. ``$WITH_CONDA`` expands to nothing where unset.
- ``notorch``: an image whose Python has no torch (bad input).

Torch (this machine's 2.13 CPU build) is in ``aif`` and ``conda``, exatrain in none. Nothing big is copied:
every entry of this venv's site-packages except exatrain's becomes a read-only layer (.twin-layers) over an
empty mount point in the tree, so a tree is built in well under a second. Not reproduced: a real conda
(the "conda env" is a venv and its activate script only sets PATH, CONDA_PREFIX and CONDA_DEFAULT_ENV),
the images' own OS, Python 3.12 and ROCm builds of torch (the twin's Python is this host's CPython 3.11).
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

PY = "/usr/bin/python3.11"  # the image OS's Python (Debian's: ABI-compatible with this venv's packages)
SITE = "lib/python3.11/site-packages"
TWIN_BIN = Path(__file__).resolve().parent / "twin"
RUNSCRIPT = (
    "#!/bin/bash\n# AI Factory-like runscript: run the arguments (a shell without any).\n"
    '[ $# -gt 0 ] || exec /bin/bash\nexec "$@"\n'
)
ACTIVATE_CONDA = """# conda's activate, as far as the twin needs it: the environment NAME under \
/opt/miniconda3/envs.
export CONDA_PREFIX=/opt/miniconda3/envs/${1:-base}
export CONDA_DEFAULT_ENV=${1:-base}
export PATH=$CONDA_PREFIX/bin:$PATH
"""


def _host_site() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _excluded(name: str) -> bool:
    return "exatrain" in name or name.startswith("__editable__") or name == "__pycache__"


def _python_env(tree: Path, prefix: str, with_torch: bool) -> list[str]:
    """A venv at PREFIX in the image (pyvenv.cfg, bin/python, activate) whose site-packages are this venv's
    packages as read-only layers; returns the .twin-layers lines."""
    root = tree / prefix.lstrip("/")
    (root / "bin").mkdir(parents=True)
    (root / SITE).mkdir(parents=True)
    (root / "pyvenv.cfg").write_text(
        f"home = {Path(PY).parent}\ninclude-system-site-packages = false\n"
        f"version = {sys.version_info.major}.{sys.version_info.minor}\n"
    )
    (root / "bin" / "python3").symlink_to(PY)
    (root / "bin" / "python").symlink_to("python3")
    (root / "bin" / "activate").write_text(f"export VIRTUAL_ENV={prefix}\nexport PATH={prefix}/bin:$PATH\n")
    if with_torch:  # torch's console script, as pip installs it into the environment's bin
        run = root / "bin" / "torchrun"
        run.write_text(
            f"#!{prefix}/bin/python\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n"
        )
        run.chmod(0o755)
    lines = []
    for entry in sorted(_host_site().iterdir()):
        if _excluded(entry.name) or (not with_torch and entry.name.startswith("torch")):
            continue
        point = root / SITE / entry.name
        point.mkdir() if entry.is_dir() else point.touch()
        lines.append(f"{entry}\t{prefix}/{SITE}/{entry.name}")
    return lines


def _finish(tree: Path, env: str, layers: list[str], runscript: str = RUNSCRIPT) -> Path:
    sd = tree / ".singularity.d"
    (sd / "env").mkdir(parents=True)
    (sd / "env" / "90-environment.sh").write_text(env)
    (sd / "runscript").write_text(runscript)
    (sd / "runscript").chmod(0o755)
    (tree / ".twin-layers").write_text("".join(line + "\n" for line in layers))
    return tree


def build_aif(tree: Path, with_torch: bool = True) -> Path:
    """AI Factory-like: /opt/venv on PATH (VIRTUAL_ENV set) by the image's environment."""
    layers = _python_env(tree, "/opt/venv", with_torch)
    return _finish(tree, "export PATH=/opt/venv/bin:$PATH\nexport VIRTUAL_ENV=/opt/venv\n", layers)


def build_conda(tree: Path) -> Path:
    """Older LUMI PyTorch-like: the conda env 'pytorch', activated only by $WITH_CONDA."""
    layers = _python_env(tree, "/opt/miniconda3/envs/pytorch", True)
    (tree / "opt/miniconda3/bin").mkdir(parents=True)
    (tree / "opt/miniconda3/bin/activate").write_text(ACTIVATE_CONDA)
    env = "export WITH_CONDA='source /opt/miniconda3/bin/activate pytorch'\n"
    runscript = '#!/bin/bash\n[ $# -gt 0 ] || exec /bin/bash\nexec "$@"\n'
    return _finish(tree, env, layers, runscript)


def build_images(root: Path) -> dict[str, Path]:
    """The three trees under ROOT (a fresh directory): {'aif': ..., 'conda': ..., 'notorch': ...}."""
    return {
        "aif": build_aif(root / "lumi-multitorch-twin.sif"),
        "conda": build_conda(root / "lumi-pytorch-rocm-twin.sif"),
        "notorch": build_aif(root / "notorch-twin.sif", with_torch=False),
    }


def lumi_tree(root: Path, project: str = "project_465000001") -> dict[str, Path]:
    """LUMI's workspace shape in a scratch tree: /pfs/lustre*/... real directories, and /scratch/<project>,
    /project/<project>, /flash/<project> links into them (as on LUMI). Returns the roots and the linked
    project paths."""
    out = {}
    for top, fs in (("scratch", "lustrep1"), ("project", "lustrep2"), ("flash", "lustrep3")):
        real = root / "pfs" / fs / top / project
        real.mkdir(parents=True)
        (root / top).mkdir(parents=True, exist_ok=True)
        (root / top / project).symlink_to(real)
        out[top] = root / top / project
        out[top + "_root"] = root / top
    out["pfs_root"] = root / "pfs"
    return out


_SESSION: dict[str, object] = {}


def session_root() -> Path:
    """A fresh folder for this test process's image trees and LUMI-like workspace, removed at exit. Not under
    /tmp, /var/tmp, $HOME or the current directory: the runtime binds those by default, and a test must see
    what an unbound path does."""
    if "root" not in _SESSION:
        import atexit
        import shutil
        import tempfile

        base = Path("/var/lib/exatrain-twin")
        base.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="session-", dir=base))
        root.chmod(0o755)
        atexit.register(shutil.rmtree, root, True)
        _SESSION["root"] = root
    return _SESSION["root"]  # type: ignore[return-value]


def session_images() -> dict[str, Path]:
    """build_images(), once per test process."""
    if "images" not in _SESSION:
        _SESSION["images"] = build_images(session_root() / "images")
    return _SESSION["images"]  # type: ignore[return-value]


def session_workspace() -> dict[str, Path]:
    """lumi_tree(), once per test process."""
    if "ws" not in _SESSION:
        _SESSION["ws"] = lumi_tree(session_root() / "ws")
    return _SESSION["ws"]  # type: ignore[return-value]


def twin_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the twin's singularity/apptainer and this venv's bin first on PATH."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{TWIN_BIN}:{Path(sys.executable).parent}:{env['PATH']}"
    return {**env, **(extra or {})}


def session_venv(kind: str) -> Path:
    """A venv with exatrain made through image KIND ('aif': started with run; 'conda': exec) by the real
    `exatrain container venv`, in the LUMI-like /project/<project> (a link into /pfs), once per process."""
    import subprocess

    key = "venv-" + kind
    if key not in _SESSION:
        ws = session_workspace()
        venv = ws["project"] / f"venv-{kind}"
        start = "run" if kind == "aif" else "exec"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "exatrain.cli.main",
                "container",
                "venv",
                f"--start={start}",
                str(session_images()[kind]),
                str(venv),
            ],
            cwd="/tmp",
            env=twin_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        _SESSION[key] = venv
    return _SESSION[key]  # type: ignore[return-value]
