"""What a ``[job] command`` runs, and how a Python script is wrapped in `exatrain run` for srun mode.

Never imports torch; reads nothing from the environment (the command is data from the job spec).
"""

from __future__ import annotations

import re
import shlex
from pathlib import PurePosixPath

from exatrain.errors import ConfigError

_PYTHON = re.compile(r"python[0-9.]*")
SCRIPT_RUNNER = "exatrain.launch.script_runner"  # how exatrain starts a Python script in a rank
LABEL_OPTION = "--label"  # the runner's option that begins each line of a rank with "[rank N] "
MASK_OPTIONS = {
    "--gpu-cpu-masks": True,
    "--cpu-masks": False,
}  # option -> masks are per GPU (else per local rank)


def mask_option(per_gpu: bool) -> str:
    """The runner's option for masks per GPU (``--gpu-cpu-masks``) or per local rank (``--cpu-masks``)."""
    return next(name for name, by_gpu in MASK_OPTIONS.items() if by_gpu == per_gpu)


def mask_options(masks: tuple[str, ...], per_gpu: bool) -> list[str]:
    """The runner option that binds each torchrun worker to its mask (none without masks)."""
    return [f"{mask_option(per_gpu)}={','.join(masks)}"] if masks else []


def command_kind(cmd: list[str]) -> str:
    """What a ``[job] command`` runs: ``trainer`` (exatrain's own, however spelled: ``exatrain train``,
    ``.venv/bin/exatrain train``, ``python -m exatrain.cli.main train``, ``python -m exatrain train``),
    ``wrapped`` (already ``exatrain run``), ``python`` (``[python[3]] [-u] SCRIPT.py|-m MODULE ...``) or
    ``other``."""
    sub = _exatrain_subcommand(cmd)
    if sub in ("train", "run"):
        return "trainer" if sub == "train" else "wrapped"
    return "python" if _python_target(cmd) is not None else "other"


def _exatrain_subcommand(cmd: list[str]) -> str | None:
    if cmd and PurePosixPath(cmd[0]).name == "exatrain" and len(cmd) > 1:
        return cmd[1]
    if cmd[1:2] == ["-m"] and cmd[2:3] in (["exatrain.cli.main"], ["exatrain"]) and len(cmd) > 3:
        return cmd[3]
    return None


def _python_target(cmd: list[str]) -> list[str] | None:
    """``SCRIPT.py ARGS`` or ``-m MODULE ARGS`` of a Python command (interpreter and ``-u`` dropped), else
    None."""
    if cmd and cmd[0].endswith(".py"):
        return cmd
    if not cmd or not _PYTHON.fullmatch(PurePosixPath(cmd[0]).name):
        return None
    rest = cmd[1:]
    while rest[:1] == ["-u"]:  # exatrain run starts the script unbuffered (-u), as torchrun does
        rest = rest[1:]
    if rest[:1] == ["-m"] and len(rest) > 1:
        return rest
    return rest if rest and rest[0].endswith(".py") else None


def check_interpreter_options(cmd: list[str]) -> None:
    """A Python command with interpreter options would get no rank variables in srun mode: say so."""
    if cmd and _PYTHON.fullmatch(PurePosixPath(cmd[0]).name) and cmd[1:2] and cmd[1].startswith("-"):
        raise ConfigError(
            f"job.command {shlex.join(cmd)!r}: srun mode wraps Python scripts in `exatrain run` "
            f"(for RANK, MASTER_ADDR, ...), which does not pass on interpreter options such as {cmd[1]!r}",
            'write ["python", "train.py", ...] or ["python", "-m", "pkg.train", ...] (-u is fine); set '
            "interpreter settings through [job.env] (e.g. PYTHONWARNINGS)",
        )


def wrap_in_exatrain_run(cmd: list[str], profile: str, label: bool = False) -> list[str]:
    """``python train.py ARGS`` -> ``python -m exatrain.cli.main run --profile=P -- train.py ARGS`` (the same
    interpreter: the one the user named, with exatrain installed); a bare ``train.py`` runs under
    ``exatrain``. ``label`` adds `exatrain run`'s ``--label`` (job.label)."""
    target = _python_target(cmd)
    head = ["exatrain"] if cmd[0].endswith(".py") else [cmd[0], "-m", "exatrain.cli.main"]
    options = [f"--profile={profile}", *([LABEL_OPTION] if label else [])]
    return [*head, "run", *options, *(target if target[0] == "-m" else ["--", *target])]


def can_label(cmd: list[str], launch: str) -> bool:
    """Whether job.label can begin this command's lines with the rank: a Python script wrapped in `exatrain
    run` (srun mode) or started through the script runner (torchrun mode; not a bare ``train.py``)."""
    return command_kind(cmd) == "python" and (launch == "srun" or starts_script_runner(cmd))


def script_runner_argv(target: list[str], options: list[str] | None = None) -> list[str]:
    """Interpreter arguments that run ``SCRIPT ARGS`` or ``-m MODULE ARGS`` through `launch.script_runner`
    (with the runner's own ``options`` before the target), unbuffered (``-u``, as torchrun starts workers) so
    ranks' lines reach the job log as they are printed."""
    return ["-u", "-m", SCRIPT_RUNNER, *(options or []), *target]


def starts_script_runner(cmd: list[str]) -> bool:
    """Whether torchrun mode starts this ``[job] command`` through `launch.script_runner` (a Python command
    with an interpreter: ``python train.py``, ``python -m pkg``; a bare ``train.py`` runs as given)."""
    return command_kind(cmd) == "python" and not cmd[0].endswith(".py")


def run_under_script_runner(
    cmd: list[str], masks: tuple[str, ...] = (), per_gpu: bool = True, label: bool = False
) -> list[str]:
    """``python [-u] train.py ARGS`` -> ``python -u -m exatrain.launch.script_runner train.py ARGS`` (torchrun
    mode: torchrun gives the variables; the runner behaves like python but exits without the interpreter's
    finalization, see `launch.script_runner`). With the job's CPU ``masks`` (per GPU, or per local rank on
    CPU nodes) the runner binds each worker to its mask first; ``label`` (job.label) gives the runner its
    ``--label``, which must come first. A bare ``train.py`` runs as given."""
    if cmd[0].endswith(".py"):
        return list(cmd)
    options = [*([LABEL_OPTION] if label else []), *mask_options(masks, per_gpu)]
    return [cmd[0], *script_runner_argv(_python_target(cmd), options)]
