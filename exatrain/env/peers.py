"""What other frameworks' launch checks will say about this process's cluster variables.

Lightning (Trainer and Fabric) picks its cluster environment itself: TorchElasticEnvironment where torchrun
started the process (TORCHELASTIC_RUN_ID), else SLURMEnvironment in any srun task whose job is not named
``bash`` or ``interactive``. SLURMEnvironment then raises at start when the step has several tasks but no
``--ntasks-per-node`` (its ``_validate_srun_variables``, lightning 2.6: SLURM_NTASKS > 1 without
SLURM_NTASKS_PER_NODE). This module states that rule on the variables, so `exatrain run` can say it first.

Same concept as launch/peers.py, one layer apart: this module states the peers' rules on cluster
variables (only env/ reads them); that one reads a user's script and applies them.
"""

from __future__ import annotations

from collections.abc import Mapping

from exatrain.env._read import first_set

# Lightning's SLURM detection stands aside for jobs with these names (its _is_slurm_interactive_mode).
LIGHTNING_INTERACTIVE_JOB_NAMES = ("bash", "interactive")


def lightning_srun_problem(environ: Mapping[str, str]) -> str | None:
    """Why Lightning's SLURMEnvironment would refuse this srun task, else None.

    None also where Lightning does not pick SLURMEnvironment (torchrun's workers, interactive job names,
    no srun task at all).
    """
    if first_set(environ, "TORCHELASTIC_RUN_ID") or "SLURM_NTASKS" not in environ:
        return None
    if environ.get("SLURM_JOB_NAME") in LIGHTNING_INTERACTIVE_JOB_NAMES:
        return None
    try:
        ntasks = int(environ["SLURM_NTASKS"])
    except ValueError:
        return None
    if ntasks <= 1 or "SLURM_NTASKS_PER_NODE" in environ:
        return None
    return (
        f"this srun step has {ntasks} tasks but SLURM_NTASKS_PER_NODE is unset (srun -n/--ntasks without "
        "--ntasks-per-node): Lightning's SLURM environment refuses to start there"
    )


def accelerate_cpu_problem(environ: Mapping[str, str], gpus: int) -> str | None:
    """Why an Accelerate script would run as separate worlds of one here, else None.

    Accelerate (1.x, ``PartialState._prepare_backend``) forms a process group on a node without GPUs only
    when asked to use the CPU (``ACCELERATE_USE_CPU``, which ``accelerate launch --cpu`` sets, or
    ``Accelerator(cpu=True)``); otherwise every rank runs alone (``DistributedType.NO``).
    """
    if gpus or environ.get("ACCELERATE_USE_CPU", "").strip().lower() in ("1", "y", "yes", "t", "true", "on"):
        return None
    return (
        "this node has no GPU and ACCELERATE_USE_CPU is unset: Accelerate then runs every rank as its "
        "own world of one (DistributedType.NO) instead of one group over gloo"
    )
