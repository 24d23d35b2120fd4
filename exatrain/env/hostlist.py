"""Expanding SLURM node lists and tasks-per-node strings in pure Python (containers lack ``scontrol``)."""

from __future__ import annotations

import re

import hostlist as _hostlist

from exatrain.errors import ClusterEnvError

_TASKS_ITEM = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def _from(source: str) -> str:
    return f" from {source}" if source else ""


def expand_nodelist(text: str, source: str = "") -> list[str]:
    """Expand a SLURM node list such as ``nid[005000-005003,005010]`` into host names, in SLURM's order.

    The order matters: the first host is the master address and node ranks index into this list, so the
    result is never sorted. ``source`` names the variable the text came from, for the error message.
    """
    try:
        hosts = _hostlist.expand_hostlist(text.strip()) if text.strip() else []
        problem = "it names no host"
    except _hostlist.BadHostlist as exc:
        hosts, problem = [], str(exc)
    if not hosts:
        raise ClusterEnvError(
            f"cannot expand the node list {text!r}{_from(source)}: {problem}",
            "a SLURM node list looks like 'node[01-04,07],gpu12'; "
            f"check {source or 'the variable'} (it is set by SLURM inside srun/sbatch, not by hand)",
        )
    return hosts


def parse_tasks_per_node(text: str, source: str = "") -> list[int]:
    """Expand SLURM's compressed tasks-per-node string: ``2(x3),1`` -> ``[2, 2, 2, 1]``.

    SLURM_TASKS_PER_NODE and SLURM_STEP_TASKS_PER_NODE use this form; entry i belongs to node i of the
    node list, which is how a process learns its local world size on uneven layouts.
    """
    counts: list[int] = []
    for item in text.split(","):
        match = _TASKS_ITEM.fullmatch(item.strip())
        if not match or int(match[1]) < 1 or int(match[2] or 1) < 1:
            raise ClusterEnvError(
                f"cannot parse the tasks-per-node string {text!r}{_from(source)} (bad item {item!r})",
                "SLURM writes it as comma-separated counts with optional repeats, e.g. '4', "
                "'2,1' or '2(x3),1'",
            )
        counts.extend([int(match[1])] * int(match[2] or 1))
    return counts
