"""`exatrain.init()`: everything a rank needs before its first collective, for any training loop.

Detects the environment (exatrain.env), joins the process group (backend by device, timeout, master
checks, roll call), picks the device, seeds every generator with the same seed (same initial weights on
every rank), builds the DeviceMesh of the data/tensor-parallel layout, checks CPU affinity and prints one
summary on rank 0. The returned Context tears all of this down again (`close()`, or a `with` block).
"""

from __future__ import annotations

import gc
import sys

import torch
import torch.distributed as dist

from exatrain.config import DistConfig, JobConfig, ParallelConfig
from exatrain.distributed.affinity import bind_torchrun_worker, check_affinity
from exatrain.distributed.collectives import print0
from exatrain.distributed.parallel_dims import ParallelDims
from exatrain.distributed.process_group import DistContext, init_distributed, teardown
from exatrain.distributed.seed import rank_seed, seed_everything
from exatrain.env import detect_environment
from exatrain.errors import ConfigError, ExatrainError
from exatrain.observe.hang import stop_watcher

_active: "Context | None" = None  # the Context of this process until it is closed


class Context:
    """One rank's place in the job: ranks, device, backend, the layout's mesh. Close it at the end."""

    def __init__(self, dist_ctx: DistContext, dims: ParallelDims, seed: int):
        self.dist, self.dims, self.seed = dist_ctx, dims, seed
        self.closed = False

    env = property(lambda self: self.dist.env, doc="The detected cluster environment (exatrain.env).")
    rank = property(lambda self: self.dist.rank, doc="Global rank.")
    local_rank = property(lambda self: self.dist.local_rank, doc="Rank on this node.")
    world_size = property(lambda self: self.dist.world_size, doc="Number of ranks.")
    local_world_size = property(lambda self: self.dist.env.local_world_size, doc="Ranks on this node.")
    device = property(lambda self: self.dist.device, doc="This rank's torch.device.")
    is_root = property(lambda self: self.dist.is_root, doc="True on global rank 0.")
    backend = property(lambda self: self.dist.backend, doc="'nccl' or 'gloo'; None without a process group.")
    mesh = property(lambda self: self.dims.root_mesh, doc="The layout's DeviceMesh; None for a single rank.")

    @property
    def dp_rank(self) -> int:
        """This rank's index among the data-parallel ranks (those that get different batches)."""
        return self.dims.coordinate("dp")

    @property
    def dp_size(self) -> int:
        """Number of data-parallel ranks (world size / tensor-parallel degree)."""
        return self.dims.dp

    def reseed(self, offset: int = 0) -> None:
        """Seed every generator per data-parallel rank (seed, dp rank, `offset`): after the model is built,
        so that replicas draw different dropout masks; ranks of one replica (TP) draw the same."""
        seed_everything(rank_seed(self.seed, self.dp_rank) + offset)

    def close(self) -> None:
        """Wait for every rank, then leave and free the process group. Safe to call twice."""
        global _active
        if self.closed:
            return
        self.closed = True
        stop_watcher()  # a rank that leaves cleanly is no hang
        if _active is self:
            _active = None
        teardown()

    def _abort(self) -> None:
        """Leave without waiting for the other ranks (after an error: they may never get here)."""
        global _active
        self.closed = True
        stop_watcher()
        if _active is self:
            _active = None
        if dist.is_initialized():
            gc.collect()
            dist.destroy_process_group()

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._abort()

    def __repr__(self) -> str:
        return (
            f"Context(rank={self.rank}, world_size={self.world_size}, device={self.device}, "
            f"backend={self.backend}, layout={self.dims.describe()!r})"
        )


def init(
    device: str = "auto",
    backend: str = "auto",
    timeout_s: float = 300.0,
    seed: int = 0,
    affinity: str = "warn",
    profile: str | None = None,
    dp_shard: int = 1,
    dp_replicate: int = -1,
    tp: int = 1,
    quiet: bool = False,
    *,
    pp: int = 1,
    summary: bool | None = None,
    environ=None,
    master_suffix: str = "",
    resolve_master: bool = False,
    master_port: int | None = None,
    job: JobConfig | None = None,
    parallel: ParallelConfig | None = None,
    dist: DistConfig | None = None,
) -> Context:
    """Set up this rank for distributed training and return its Context (see the module docstring).

    Works unchanged under srun, mpirun, torchrun, `exatrain run` and as a single plain process. `environ`
    (default os.environ) and the master_* options go to exatrain.env.detect_environment. `pp`: pipeline
    degree of the mesh (exatrain's reference trainer pipelines its own model; parallelize does not).
    `summary`: print the summary table (default: unless quiet); quiet also silences affinity "warn".
    `job`: the [job] section the rank was submitted with (exatrain's trainer passes it): its launch mode and
    partition decide which CPU masks apply; in torchrun mode each worker binds itself to its GPU's mask here,
    before anything is allocated. Default: a job of `profile` (or the default profile).
    `parallel`, `dist`: whole configuration sections ([parallel], [dist]) instead of their keywords (the
    degrees; backend, timeout_s, affinity and the master options); given, they win over those keywords.
    """
    if dist is not None:
        backend, timeout_s, affinity = dist.backend, dist.timeout_s, dist.affinity
        master_suffix, resolve_master, master_port = (
            dist.master_suffix,
            dist.resolve_master,
            dist.master_port or None,
        )
    parallel = parallel or ParallelConfig(dp_replicate=dp_replicate, dp_shard=dp_shard, tp=tp, pp=pp)
    _check_not_active()
    _check_choice("affinity", affinity, ("warn", "strict", "off"))
    env = detect_environment(
        environ, master_suffix=master_suffix, resolve_master=resolve_master, master_port=master_port
    )
    dims = ParallelDims.from_config(parallel, env.world_size)
    job = job or (JobConfig(profile=profile) if profile else JobConfig())
    bound = bind_torchrun_worker(job, env.kind, env.local_rank, _uses_gpu(device))
    dist_ctx = init_distributed(env, device, backend, timeout_s)
    ctx = Context(dist_ctx, dims, seed)
    _set_active(ctx)
    try:
        dims.build_mesh(ctx.device.type)
        seed_everything(seed)
        if (not quiet) if summary is None else summary:
            print0(summary_table(ctx))
        check_affinity(dist_ctx, job, "off" if quiet and affinity == "warn" else affinity, bound)
    except BaseException:
        ctx._abort()
        raise
    return ctx


def _uses_gpu(device: str) -> bool:
    """Whether init_distributed will put this rank on a GPU (device auto/cuda with one present)."""
    return device != "cpu" and torch.cuda.is_available() and torch.cuda.device_count() > 0


def summary_table(ctx: Context) -> str:
    """The start-up summary rank 0 prints: one table of where and how the job runs."""
    rows = [
        ("ranks", f"{ctx.world_size} ({ctx.local_world_size} on this node), launched by {ctx.env.kind}"),
        ("device", f"{ctx.device.type} (backend {ctx.backend or 'none: single process'})"),
        ("master", f"{ctx.env.main_address}:{ctx.env.main_port}" if ctx.world_size > 1 else "-"),
        ("layout", ctx.dims.describe()),
        ("seed", str(ctx.seed)),
    ]
    width = max(len(k) for k, _ in rows)
    return "exatrain.init\n" + "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


def _check_not_active() -> None:
    if _active is not None:
        raise ExatrainError(
            f"exatrain.init() was called twice: this process already has a Context ({_active!r})",
            "call init() once and pass its Context around, or call ctx.close() before init() again "
            "(`with exatrain.init() as ctx:` closes it for you)",
        )
    if dist.is_available() and dist.is_initialized():
        raise ExatrainError(
            "exatrain.init(): a torch.distributed process group already exists "
            "(init_process_group was called before)",
            "let exatrain.init() create the group (drop your init_process_group call), or call "
            "torch.distributed.destroy_process_group() first",
        )


def _set_active(ctx: Context) -> None:
    global _active
    _active = ctx
    install_excepthook()


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ConfigError(
            f"exatrain.init({name}={value!r}): not one of {', '.join(map(repr, choices))}",
            f"pass {name}={choices[0]!r}",
        )


def install_excepthook() -> None:
    """Print an uncaught ExatrainError as its message and HINT (no traceback) and exit with code 2, like the
    CLI does; other exceptions keep Python's usual report."""
    if getattr(sys.excepthook, "_exatrain", False):
        return
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        if isinstance(exc, ExatrainError):
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else None
            prefix = f"[rank {rank}] " if rank is not None else ""
            print(f"{prefix}error: {exc}", file=sys.stderr, flush=True)
            sys.exit(2)  # the hook runs at interpreter exit: this sets the exit code
        previous(exc_type, exc, tb)

    hook._exatrain = True
    sys.excepthook = hook
