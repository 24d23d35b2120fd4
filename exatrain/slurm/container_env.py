"""The Python environment of a container job: how the ranks activate it inside the image, how a user
creates it, and the check `exatrain submit` runs through the runtime before submitting. Never imports torch.

No site image contains exatrain. LUMI documents one way to add packages on top of an image: a venv created
*through* the container with ``--system-site-packages`` on a bound path, activated inside the job (LUMI AI
guide, "Setting up the environment"; the LUMI AI workshop scripts run
``singularity exec $SIF bash -c '$WITH_CONDA && source venv/bin/activate && python ...'``). Two image
generations: the AI Factory images (/appl/local/laifs/containers/..., a venv at /opt/venv on PATH, started
with ``singularity run``) and the older LUMI PyTorch images (/appl/local/containers/sif-images/..., a conda
environment that ``$WITH_CONDA`` activates; the word expands to nothing where the image does not set it).
The ranks' entry does both: ``$WITH_CONDA``, then the job's venv, then a one-line check that exatrain
imports (only rank 0 prints the HINT), then the command.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from exatrain.errors import ExatrainError

STARTS = ("exec", "run")
EXIT_NO_EXATRAIN = 97  # a rank's exit code when exatrain does not import inside the image
_VERSIONS_PY = (
    "import importlib.metadata as m, sys; import torch; print('torch', torch.__version__); "
    "import exatrain; print('exatrain', m.version('exatrain'), sys.prefix)"
)
# The venv's site-packages only see the Python that created it: a venv created from the image's own venv
# (AI Factory: /opt/venv) would otherwise miss the image's torch. This .pth adds the creator's packages.
_LINK_PY = (
    "import site, sys, pathlib; v = pathlib.Path(sys.argv[1]); "
    "sp = next(v.glob('lib/python*/site-packages')); "
    "(sp / '_exatrain_image_env.pth').write_text(''.join(p + '\\n' for p in site.getsitepackages()))"
)

# A checkout is built from a copy of what its wheel holds (the copy sits in the new venv and is removed after
# the install): setuptools builds in the source tree's build/, which two builds at once, or one interrupted
# earlier (its leftover build/bdist.*/wheel/*.dist-info), break ("File exists"); the clone may be read-only.
_SOURCE_FILES = ("pyproject.toml", "README.md", "LICENSE")
_COPY_SOURCE_PY = (
    "import shutil, sys, pathlib; src, dst = map(pathlib.Path, sys.argv[1:3]); dst.mkdir(); "
    "[shutil.copy2(src / f, dst / f) for f in sys.argv[3:] if (src / f).is_file()]; "
    "shutil.copytree(src / 'exatrain', dst / 'exatrain', ignore=shutil.ignore_patterns('__pycache__'))"
)


def fix_command(runtime: str, image: str, venv: str, binds: tuple[str, ...] = ()) -> str:
    """The command that creates VENV for IMAGE (what every HINT below tells the user to run)."""
    bind = [f"--bind={','.join(binds)}"] if binds else []
    return shlex.join(["exatrain", "container", "venv", f"--runtime={runtime}", *bind, image, venv or "VENV"])


def activation(venv: str) -> str:
    """Shell text run inside the image before the rank command: conda (older LUMI images), the job's venv."""
    lines = ["$WITH_CONDA"]  # LUMI PyTorch images: activates their conda env; empty (a no-op) elsewhere
    if venv:
        q = shlex.quote(venv)
        lines.append(
            f'[ -r {q}/bin/activate ] || {{ [ "${{SLURM_PROCID:-0}}" != 0 ] || echo "exatrain: error: '
            f"the venv {venv} is not visible in the image on $(hostname) (not created, or its path "
            'not bound)" >&2; exit ' + str(EXIT_NO_EXATRAIN) + "; }"
        )
        lines.append(f". {q}/bin/activate")
    return "; ".join(lines)


def entry_words(runtime: str, image: str, venv: str, binds: tuple[str, ...]) -> list[str]:
    """``bash -c SCRIPT exatrain-env`` before the rank command: activate, check exatrain imports (a rank
    that cannot fails within seconds; rank 0 alone prints the error and HINT), then exec the command."""
    hint = fix_command(runtime, image, venv, binds)
    hint_line = f"HINT: create the venv once on a login node: {hint}, then set job.container_venv"
    script = "; ".join(
        [
            activation(venv),
            "if ! python3 -c 'import exatrain' 2>/dev/null; then "
            'if [ "${SLURM_PROCID:-0}" = 0 ]; then '
            f"echo {shlex.quote(f'exatrain: error: exatrain does not import inside the image {image}')}"
            ' "on $(hostname) (python3: $(command -v python3))" >&2; '
            f"echo {shlex.quote(hint_line)}"
            f" >&2; fi; exit {EXIT_NO_EXATRAIN}; fi",
            'exec "$@"',
        ]
    )
    return ["bash", "-c", script, "exatrain-env"]


def missing_binds(binds: tuple[str, ...]) -> list[str]:
    """The bind specs whose source path does not exist here."""
    return [b for b in binds if b and not os.path.exists(b.split(":")[0])]


def check_binds(binds: tuple[str, ...]) -> None:
    """A bind whose source does not exist fails the container at start on every node: refuse it now."""
    missing = missing_binds(binds)
    if missing:
        raise ExatrainError(
            f"container bind path(s) {', '.join(missing)} do not exist here",
            "create them, or correct job.container_binds (src[:dst[:opts]], each src must exist "
            "on the login and compute nodes)",
        )


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ExatrainError(
            f"{argv[0]} did not finish within {timeout:g} s: {shlex.join(argv[:6])} ...",
            "the login node or the image's file system may be slow; try again",
        ) from None


def check_image(
    runtime: str, image: str, start: str, venv: str, binds: tuple[str, ...], timeout: float = 180.0
) -> tuple[str, str]:
    """Start IMAGE through RUNTIME with the job's activation and binds and import torch and exatrain.

    Returns (torch version, exatrain version); raises ExatrainError naming the image and the fix."""
    exe = shutil.which(runtime)
    if exe is None:
        raise ExatrainError(
            f"{runtime} not found on PATH: cannot check the image {image}",
            f"run `exatrain submit` where {runtime} works (LUMI: any login node), or set "
            "job.container_runtime in the profile",
        )
    if not os.path.exists(image):
        raise ExatrainError(f"container image {image} does not exist", "check job.container_image (ls -l it)")
    bind = [f"--bind={','.join(binds)}"] if binds else []
    script = activation(venv) + f"; exec python3 -c {shlex.quote(_VERSIONS_PY)}"
    done = _run([exe, start, *bind, image, "bash", "-c", script], timeout)
    out = dict(
        line.split(" ", 1) for line in done.stdout.splitlines() if line.startswith(("torch ", "exatrain "))
    )
    fix = fix_command(runtime, image, venv, binds)
    if "torch" not in out:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ExatrainError(
            f"the Python of image {image} does not import torch ({why})",
            f"pick an image with PyTorch (LUMI: /appl/local/laifs/containers/...); an older LUMI "
            f"image needs no change ($WITH_CONDA is run); if VENV is yours, recreate it: {fix}",
        )
    if "exatrain" not in out:
        where = f"the venv {venv}" if venv else "the image (no job.container_venv set)"
        raise ExatrainError(
            f"exatrain does not import in {where} with image {image}",
            f"create the venv once: {fix}, then set job.container_venv to its path",
        )
    return out["torch"], out["exatrain"].split()[0]


def source_spec() -> str:
    """What pip installs for exatrain: this checkout when exatrain runs from one, else the same release."""
    from exatrain import __version__

    root = Path(__file__).resolve().parents[2]
    return str(root) if (root / "pyproject.toml").is_file() else f"exatrain=={__version__}"


def venv_command(
    runtime: str, image: str, venv: str, start: str, binds: tuple[str, ...], packages: tuple[str, ...]
) -> list[str]:
    """The runtime command that creates VENV through IMAGE (``--system-site-packages``: the image's torch
    stays the one used, pinned by a constraint so that pip never replaces it) and installs exatrain and
    PACKAGES into it with the image's pip."""
    v = shlex.quote(venv)
    exatrain = source_spec()
    copy = []
    if exatrain.startswith("/"):  # a checkout: built with the image's setuptools, from a copy (see above)
        copy = [
            shlex.join(["python", "-c", _COPY_SOURCE_PY, exatrain, f"{venv}/.exatrain-src", *_SOURCE_FILES])
        ]
        exatrain = f"{venv}/.exatrain-src"
    local = ["--no-build-isolation"] if copy else []
    script = "\n".join(
        [
            "set -e",
            "$WITH_CONDA",
            f"python -m venv --system-site-packages --without-pip {v}",
            f"python -c {shlex.quote(_LINK_PY)} {v}",
            f". {v}/bin/activate",
            f"python -c 'import torch; print(\"torch==\" + torch.__version__)' > {v}/image-constraints.txt",
            *copy,
            shlex.join(
                [
                    "python",
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--constraint",
                    f"{venv}/image-constraints.txt",
                    *local,
                    exatrain,
                    *packages,
                ]
            ),
            *([f"rm -rf {shlex.quote(exatrain)}"] if copy else []),
        ]
    )
    bind = [f"--bind={','.join(binds)}"] if binds else []
    return [runtime, start, *bind, image, "bash", "-c", script]
