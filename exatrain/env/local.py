"""A plain process: one rank on this machine (also the SLURM batch or salloc shell).

Same concept as launch/local.py, one layer apart: this module describes a local run's environment; that one
starts local workers.
"""

from __future__ import annotations

from collections.abc import Mapping

from exatrain.env._read import first_set, slurm_job_id, slurm_step_id
from exatrain.env.base import LOOPBACK, ClusterEnvironment, Layout


class LocalEnvironment(ClusterEnvironment):
    """World size 1 on 127.0.0.1; notes when a SLURM job's tasks are left unused."""

    kind = "local"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """Always applies: the fallback when no launcher is recognised."""
        return True

    def _read_layout(self, environ: Mapping[str, str]) -> Layout:
        return Layout(world_size=1, global_rank=0, local_rank=0, local_world_size=1, node_rank=0, num_nodes=1)

    def _read_main_address(self, environ: Mapping[str, str], master_suffix: str) -> str:
        return LOOPBACK

    def _read_notes(self, environ: Mapping[str, str]) -> tuple[str, ...]:
        job = slurm_job_id(environ)
        if job is None or slurm_step_id(environ) is not None:
            return ()
        ntasks = first_set(environ, "SLURM_NTASKS")
        tasks = f"the job's {ntasks[1]} tasks" if ntasks else "the job's tasks"
        return (
            f"inside SLURM job {job}'s batch or salloc shell (not a job step): running as one process; "
            f"launch with `srun exatrain ...` to use {tasks}",
        )
