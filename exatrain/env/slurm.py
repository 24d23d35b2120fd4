"""Processes started by ``srun`` as tasks of a SLURM job step."""

from __future__ import annotations

from collections.abc import Mapping

from exatrain.env._read import (
    SLURM_JOB_ID_VARS,
    SLURM_STEP_ID_VARS,
    check_below,
    first_set,
    parse_int,
    require,
)
from exatrain.env.base import ClusterEnvironment, Layout
from exatrain.env.hostlist import expand_nodelist, parse_tasks_per_node
from exatrain.env.ports import derive_port
from exatrain.errors import ClusterEnvError

_WHY = "srun sets it for every task of a job step"
# Step-level variables describe the step actually running; job-level ones the whole allocation, which
# can be larger (e.g. `srun -n2` inside `sbatch -n8`). Prefer the step, fall back to the job.
_WORLD_VARS = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
_NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
_TASKS_PER_NODE_VARS = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")


def _int_var(environ: Mapping[str, str], *names: str, minimum: int = 0) -> tuple[str, int]:
    name, value = require(environ, *names, why=_WHY)
    return name, parse_int(value, name, minimum)


class SlurmEnvironment(ClusterEnvironment):
    """Ranks from SLURM_PROCID/LOCALID/NODEID, sizes from the step's node list and tasks-per-node string."""

    kind = "slurm"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """Only a running job step counts: the batch shell also has SLURM_JOB_ID and SLURM_PROCID=0,
        but no SLURM_STEP_ID, and must not pose as rank 0 of the job's tasks."""
        return bool(
            first_set(environ, *SLURM_JOB_ID_VARS)
            and first_set(environ, *SLURM_STEP_ID_VARS)
            and first_set(environ, "SLURM_PROCID")
        )

    def _read_layout(self, environ: Mapping[str, str]) -> Layout:
        self._job = require(environ, *SLURM_JOB_ID_VARS, why=_WHY)[1]
        self._step = require(environ, *SLURM_STEP_ID_VARS, why=_WHY)[1]
        self._nodes_source, self._nodes = self._read_nodes(environ)
        world_source, world = _int_var(environ, *_WORLD_VARS, minimum=1)
        _, rank = _int_var(environ, "SLURM_PROCID")
        _, local_rank = _int_var(environ, "SLURM_LOCALID")
        _, node_rank = _int_var(environ, "SLURM_NODEID")
        tasks_source, tasks = self._read_tasks_per_node(environ, world, world_source)
        nodes = f"the {len(self._nodes)} hosts of {self._nodes_source}"
        check_below(rank, "SLURM_PROCID", world, world_source)
        check_below(node_rank, "SLURM_NODEID", len(self._nodes), nodes)
        check_below(local_rank, "SLURM_LOCALID", tasks[node_rank], f"entry {node_rank} of {tasks_source}")
        return Layout(world, rank, local_rank, tasks[node_rank], node_rank, len(self._nodes))

    @staticmethod
    def _read_nodes(environ: Mapping[str, str]) -> tuple[str, list[str]]:
        name, text = require(environ, *_NODELIST_VARS, why=_WHY)
        return name, expand_nodelist(text, name)

    def _read_tasks_per_node(
        self, environ: Mapping[str, str], world: int, world_source: str
    ) -> tuple[str, list[int]]:
        name, text = require(environ, *_TASKS_PER_NODE_VARS, why=_WHY)
        tasks = parse_tasks_per_node(text, name)
        if len(tasks) != len(self._nodes) or sum(tasks) != world:
            raise ClusterEnvError(
                f"{name}={text!r} ({len(tasks)} nodes, {sum(tasks)} tasks) does not match "
                f"{self._nodes_source} ({len(self._nodes)} nodes) and {world_source}={world} tasks",
                "step and job variables are mixed (e.g. SLURM_STEP_* missing or exported by hand); "
                "start the processes with srun so SLURM sets a consistent set",
            )
        return name, tasks

    def _read_main_address(self, environ: Mapping[str, str], master_suffix: str) -> str:
        chosen = first_set(environ, "MASTER_ADDR")
        return chosen[1] if chosen else self._nodes[0] + master_suffix

    def _default_port(self, environ: Mapping[str, str]) -> int:
        return derive_port(self._job, self._step)
