"""What a user's script is written for, read from its source (never imported: no torch here).

`exatrain run` adapts to two kinds of scripts it cannot change:

- scripts that start their own worker processes with ``torch.multiprocessing.spawn`` (or
  ``start_processes``), the pattern of many tutorials: they are one process that becomes a world, so they run
  once (``--nproc 1``), never under an agent that shares its store with them (their processes would wait in
  that store for ranks that never come);
- scripts of other frameworks that pick their own launch environment (Lightning, Accelerate): exatrain
  warns where that framework's own rules will refuse or quietly split the world (`env.peers`).

Only the script's own file is read (``-m MODULE`` targets and imports inside other modules are not
followed); a file that does not parse counts as "nothing detected" (python will report its error).

Same concept as env/peers.py, one layer apart: that module states the peers' rules on cluster
variables (only env/ reads them); this one reads a user's script and applies them.
"""

from __future__ import annotations

import ast
from pathlib import Path

from exatrain.env.peers import accelerate_cpu_problem, lightning_srun_problem
from exatrain.errors import ExatrainError

_SPAWNERS = ("spawn", "start_processes")
# The top-level packages of the frameworks exatrain has rules for (docs/peers.md).
LIGHTNING_PACKAGES = ("lightning", "pytorch_lightning", "lightning_fabric")
ACCELERATE_PACKAGES = ("accelerate",)


def parse_script(path: str | Path) -> ast.Module | None:
    """The script's syntax tree, or None where it cannot be read or parsed."""
    try:
        return ast.parse(Path(path).read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None


def imported_packages(tree: ast.Module | None) -> frozenset[str]:
    """The top-level packages the script imports anywhere in its file (``import a.b`` -> ``a``)."""
    names: set[str] = set()
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return frozenset(names)


def uses_any(tree: ast.Module | None, packages: tuple[str, ...]) -> bool:
    """Whether the script imports one of ``packages``."""
    return not imported_packages(tree).isdisjoint(packages)


def spawn_line(tree: ast.Module | None) -> int | None:
    """The line of the script's first ``torch.multiprocessing.spawn``/``start_processes`` call, else None.

    Followed: ``import torch``, ``import torch.multiprocessing [as mp]``, ``from torch import multiprocessing
    [as mp]`` and ``from torch.multiprocessing import spawn [as s]``.
    """
    if tree is None:
        return None
    torch_names, mp_names, fn_names = _spawn_aliases(tree)
    lines = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and _is_spawn(node.func, torch_names, mp_names, fn_names)
    ]
    return min(lines, default=None)


def _spawn_aliases(tree: ast.Module) -> tuple[set[str], set[str], set[str]]:
    torch_names, mp_names, fn_names = set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch.multiprocessing" and alias.asname:
                    mp_names.add(alias.asname)
                elif alias.name.split(".")[0] == "torch" and not alias.asname:
                    torch_names.add("torch")
                elif alias.name == "torch":
                    torch_names.add(alias.asname)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                if node.module == "torch" and alias.name == "multiprocessing":
                    mp_names.add(alias.asname or alias.name)
                elif node.module == "torch.multiprocessing" and alias.name in _SPAWNERS:
                    fn_names.add(alias.asname or alias.name)
    return torch_names, mp_names, fn_names


def _is_spawn(func: ast.expr, torch_names: set[str], mp_names: set[str], fn_names: set[str]) -> bool:
    if isinstance(func, ast.Name):
        return func.id in fn_names
    if not isinstance(func, ast.Attribute) or func.attr not in _SPAWNERS:
        return False
    base = func.value
    if isinstance(base, ast.Name):
        return base.id in mp_names
    return (
        isinstance(base, ast.Attribute)
        and base.attr == "multiprocessing"
        and isinstance(base.value, ast.Name)
        and base.value.id in torch_names
    )


def self_spawning_nproc(requested: int | None, script: str, line: int) -> tuple[int, str | None]:
    """The local worker count for a script that starts its own processes: one (the script makes its world),
    with a note when that replaced the default; an explicit ``--nproc N > 1`` is refused (each of the N
    copies would start a world of its own)."""
    what = f"{script} starts its own worker processes (torch.multiprocessing, line {line})"
    if requested is None:
        return 1, f"{what}: running it once (--nproc 1); its processes form their own group"
    if requested > 1:
        raise ExatrainError(
            f"{what}, and --nproc {requested} would start {requested} copies of it, each with its own world",
            f"run it once: `exatrain run --nproc 1 {script}` (or `python {script}`); "
            "or remove the spawn call and let exatrain start the ranks",
        )
    return 1, None


def shared_store_error(script: str, line: int) -> ExatrainError:
    """The error for a self-spawning script in a torchrun worker whose agent shares its store with it: the
    spawned processes would join the agent's store (TORCHELASTIC_USE_AGENT_STORE) and wait there."""
    return ExatrainError(
        f"{script} starts its own worker processes (torch.multiprocessing, line {line}) "
        "inside a torchrun worker whose agent shares its TCP store: those processes would wait "
        "in torchrun's store for a group that never forms (a hang)",
        f"start it once outside torchrun: `exatrain run --nproc 1 {script}` or `python "
        f"{script}`; under torchrun export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 first "
        "(then each spawned process group makes its own store)",
    )


def peer_warnings(tree: ast.Module | None, environ, gpus: int, *, launched: bool) -> list[str]:
    """Warnings (each with a HINT) for a Lightning or Accelerate script whose framework will refuse this
    launch or split its world. ``launched``: this process is a launcher's rank (srun, mpirun, torchrun),
    not the parent of local workers (whose workers are torchrun's, which Lightning accepts)."""
    notes = []
    problem = lightning_srun_problem(environ) if launched and uses_any(tree, LIGHTNING_PACKAGES) else None
    if problem:
        notes.append(
            f"WARNING: {problem}\nHINT: start the step with --ntasks-per-node (srun -N NODES "
            "--ntasks-per-node=TASKS exatrain run ...; scripts from `exatrain submit` do), or name "
            "the job `interactive` to make Lightning leave SLURM alone (docs/peers.md)"
        )
    problem = accelerate_cpu_problem(environ, gpus) if uses_any(tree, ACCELERATE_PACKAGES) else None
    if problem:
        notes.append(
            f"WARNING: {problem}\nHINT: export ACCELERATE_USE_CPU=1 (what `accelerate launch --cpu` "
            "sets) or create Accelerator(cpu=True) (docs/peers.md)"
        )
    return notes
