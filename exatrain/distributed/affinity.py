"""CPU binding at start (exatrain.init, exatrain train). In torchrun mode each worker binds itself to its
GPU's cores (one SLURM task holds all of a node's cores there, so srun cannot bind per GPU); then every rank
compares its CPU affinity with the cores expected for it, rank 0 prints one table, and a mismatch warns
(dist.affinity = warn) or fails the job (strict).

Same concept as env/affinity.py, one layer apart: that module reads and compares masks (no torch); this one
binds and reports at start.
"""

from __future__ import annotations

from exatrain.config.schema import JobConfig
from exatrain.distributed.collectives import all_gather_objects, print0
from exatrain.distributed.process_group import DistContext
from exatrain.env.affinity import bind_worker, check_rank, format_table, physical_gpu
from exatrain.errors import ConfigError, ExatrainError
from exatrain.slurm.binding import cpu_binding
from exatrain.slurm.profiles import load_profile
from exatrain.slurm.spec import JobSpec

_HINT = (
    "bind each rank to its cores: scripts from `exatrain sbatch` pass the profile's masks to srun "
    "--cpu-bind=mask_cpu (srun mode) or let each torchrun worker bind itself (torchrun mode); check the "
    "binding with `taskset -p PID` and the profile's cpu_masks; --dist.affinity=warn runs anyway"
)


def job_masks(job: JobConfig) -> tuple[str, ...]:
    """The per-GPU masks the job's ranks are bound to (launch.binding): the profile's where the job holds
    their cores, none for partial nodes on shared partitions; a [job] that is no valid spec: the profile's."""
    profile = load_profile(job.profile)
    try:
        return cpu_binding(JobSpec.from_config(job), profile).masks
    except ConfigError:
        return profile.cpu_masks


def bind_torchrun_worker(job: JobConfig, kind: str, local_rank: int, on_gpu: bool) -> str:
    """torchrun mode (a torchelastic worker of a ``launch = "torchrun"`` job): bind this process to its GPU's
    mask (its local rank's when it uses no GPU) before it allocates anything (env.affinity.bind_worker, which
    the script runner uses for users' scripts too). Returns what was done, for the affinity table ('' =
    nothing)."""
    if job.launch != "torchrun" or kind != "torchelastic":
        return ""
    masks = job_masks(job)
    return bind_worker(masks, local_rank, on_gpu).note if masks else ""


def check_affinity(ctx: DistContext, job: JobConfig, mode: str, note: str = "") -> None:
    """Gather every rank's verdict (collective), print the table on rank 0; strict: raise on every rank."""
    if mode == "off":
        return
    profile = job.profile
    gpu = physical_gpu(ctx.device.index or 0) if ctx.device.type == "cuda" else None
    mine = check_rank(ctx.rank, ctx.env.hostname, gpu, ctx.local_rank, job_masks(job))
    gathered = all_gather_objects((mine, note))
    reports = [report for report, _ in gathered]
    for line in sorted({n for _, n in gathered if n}):
        print0(line)
    if all(r.verdict == "unchecked" for r in reports):
        print0(
            "CPU affinity: unchecked (no CPU masks apply to these ranks and none uses a GPU whose NUMA node "
            "is known)"
        )
        return
    print0(f"CPU affinity (profile {profile}):\n{format_table(reports)}")
    bad = [r for r in reports if r.mismatch]
    if not bad:
        return
    what = "; ".join(
        f"rank {r.rank} on {r.host}: expected cores {r.expected}, runs on {r.actual}" for r in bad
    )
    if mode == "strict":
        raise ExatrainError(f"CPU affinity mismatch (dist.affinity=strict): {what}", _HINT)
    print0(f"WARNING: CPU affinity mismatch: {what}\nHINT: {_HINT}")
