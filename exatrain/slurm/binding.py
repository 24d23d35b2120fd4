"""Which CPU binding a job's srun step gets: the profile's per-GPU masks, or SLURM's own. Never imports torch.

The masks name fixed cores (LUMI-G: GCD i -> the cores of its CCD). A job step contains only the cores its
job was given, and ``srun -c`` implies ``--exact``: on a shared partition, or with fewer GPUs than the node
has, the step may hold other cores than the masks name, and binding to cores outside the step fails or
overlaps another job. LUMI's documentation, too, applies its binding recipe to full-node allocations.
So masks are used only where the job holds the cores they name: every GPU of a node, on a partition that
allocates whole nodes or with every usable core requested. Otherwise SLURM binds each task to cores of its
own allocation, and the script says why there are no masks. (CPU profiles list one mask per local rank of
the user's own nodes; they are always used.)
"""

from __future__ import annotations

from dataclasses import dataclass

from exatrain.slurm.profiles import SiteProfile
from exatrain.slurm.spec import JobSpec


@dataclass(frozen=True)
class Binding:
    """The masks to pass to ``--cpu-bind=mask_cpu`` (empty = SLURM's binding) and why, for the script."""

    masks: tuple[str, ...]
    reason: str


def cpu_binding(spec: JobSpec, profile: SiteProfile) -> Binding:
    """The profile's masks where the job holds exactly the cores they name; else none, with the reason."""
    if not profile.cpu_masks:
        return Binding((), "")
    if not profile.gpus_per_node:  # CPU nodes: one mask per local rank, for the user's own nodes
        return Binding(profile.cpu_masks, "local rank i gets mask i of the profile")
    ranks, cpus = spec.ranks_per_node(profile), spec.cpus(profile)
    partition = spec.partition or profile.partition
    part = profile.partition_named(partition)
    whole = bool(part and part.whole_nodes)
    if ranks == len(profile.cpu_masks) and (whole or ranks * cpus == profile.usable_cores):
        return Binding(
            profile.cpu_masks, "local rank i gets the cores closest to GPU i (mask i of the profile)"
        )
    if ranks < len(profile.cpu_masks):
        why = f"the job uses {ranks} of the {len(profile.cpu_masks)} GPUs of a node"
    else:
        why = (
            f"partition {partition!r} allocates by resources and the job asks for {ranks * cpus} of "
            f"{profile.usable_cores} usable cores per node"
        )
    return Binding(
        (),
        f"no per-GPU masks: {why}, so its step need not hold the cores the profile's masks name; "
        "SLURM binds each task to cores of its own allocation (use whole nodes for the masks)",
    )
