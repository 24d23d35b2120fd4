"""The affinity check at start (exatrain.init, exatrain train): every rank compares its CPU affinity with the
cores expected for it, rank 0 prints one table, and a mismatch warns (warn) or fails the job (strict)."""

from __future__ import annotations

from exatrain.distributed.collectives import all_gather_objects, print0
from exatrain.distributed.process_group import DistContext
from exatrain.env.affinity import check_rank, format_table, physical_gpu
from exatrain.errors import ExatrainError
from exatrain.launch.profiles import load_profile

_HINT = ("bind each rank to its cores: scripts from `exatrain sbatch` (srun mode) pass the profile's masks to "
         "srun --cpu-bind=mask_cpu; check the binding with `taskset -p PID` and the profile's cpu_masks; "
         "--dist.affinity=warn runs anyway")


def check_affinity(ctx: DistContext, profile: str, mode: str) -> None:
    """Gather every rank's verdict (collective), print the table on rank 0; strict: raise on every rank."""
    if mode == "off":
        return
    gpu = physical_gpu(ctx.device.index or 0) if ctx.device.type == "cuda" else None
    mine = check_rank(ctx.rank, ctx.env.hostname, gpu, ctx.local_rank, load_profile(profile).cpu_masks)
    reports = all_gather_objects(mine)
    if all(r.verdict == "unchecked" for r in reports):
        print0(f"CPU affinity: unchecked (profile {profile} has no CPU masks and no rank uses a GPU whose NUMA "
               "node is known)")
        return
    print0(f"CPU affinity (profile {profile}):\n{format_table(reports)}")
    bad = [r for r in reports if r.mismatch]
    if not bad:
        return
    what = "; ".join(f"rank {r.rank} on {r.host}: expected cores {r.expected}, runs on {r.actual}" for r in bad)
    if mode == "strict":
        raise ExatrainError(f"CPU affinity mismatch (dist.affinity=strict): {what}", _HINT)
    print0(f"WARNING: CPU affinity mismatch: {what}\nHINT: {_HINT}")
