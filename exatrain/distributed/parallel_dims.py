"""ParallelDims: the one place that knows the layout's degrees and mesh shapes.

Degrees are checked against the world size and the model before any process group work, so a wrong
layout fails in the first second with a HINT instead of hanging in a collective. After the process
group exists, `build_mesh` creates ONE named DeviceMesh; everything else asks for a sub-mesh by name
(`dims.mesh("tp")`, `dims.mesh("fsdp")`, ...), never by shape.

Mesh dimension order is pp, dp_replicate, dp_shard, tp (outermost to innermost): tensor parallel is the
most communication-heavy, so its ranks are adjacent (same node on a real cluster); pipeline stages only
exchange activations, so they may span nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from exatrain.config import ParallelConfig
from exatrain.config.validate import check_choice
from exatrain.errors import ConfigError

DIM_ORDER = ("pp", "dp_replicate", "dp_shard", "tp")
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
AC_MODES = ("none", "full", "every")


@dataclass(frozen=True)
class ParallelDims:
    """Resolved degrees of one layout (all >= 1, product == world_size)."""

    pp: int
    dp_replicate: int
    dp_shard: int
    tp: int
    world_size: int

    @classmethod
    def from_config(cls, cfg: ParallelConfig, world_size: int) -> "ParallelDims":
        """Resolve the one -1 degree (if any) and check the product equals `world_size`."""
        degrees = {name: getattr(cfg, name) for name in DIM_ORDER}
        bad = {k: v for k, v in degrees.items() if v == 0 or v < -1}
        if bad:
            k, v = next(iter(bad.items()))
            raise ConfigError(
                f"parallel.{k}={v} is not a degree",
                f"use a positive degree or -1 (infer), e.g. --parallel.{k}=1",
            )
        inferred = [k for k, v in degrees.items() if v == -1]
        if len(inferred) > 1:
            raise ConfigError(
                f"only one parallel degree may be -1, got {', '.join('parallel.' + k for k in inferred)}",
                f"set all but one of them, e.g. --parallel.{inferred[1]}=1",
            )
        known = math.prod(v for v in degrees.values() if v != -1)
        if inferred:
            if world_size % known:
                raise ConfigError(
                    f"cannot infer parallel.{inferred[0]}: world size {world_size} is not "
                    "divisible by the product "
                    f"{_formula(degrees)} = {known} of the other degrees",
                    f"choose degrees whose product divides {world_size}, or run on a multiple of "
                    f"{known} ranks",
                )
            degrees[inferred[0]] = world_size // known
        if math.prod(degrees.values()) != world_size:
            raise ConfigError(
                f"the parallel layout {_formula(degrees)} = {math.prod(degrees.values())} ranks "
                "does not match "
                f"the world size {world_size}",
                f"make pp x dp_replicate x dp_shard x tp equal {world_size} (or set one degree to "
                "-1 to infer it)",
            )
        return cls(world_size=world_size, **degrees)

    # -- what the layout enables -----------------------------------------------------------------
    @property
    def dp(self) -> int:
        """Data-parallel degree: how many different batches are processed in one step."""
        return self.dp_replicate * self.dp_shard

    @property
    def fsdp(self) -> bool:
        return self.dp_shard > 1

    @property
    def hsdp(self) -> bool:
        return self.dp_shard > 1 and self.dp_replicate > 1

    @property
    def ddp(self) -> bool:
        """Plain replication (DDP): replicas without sharding."""
        return self.dp_replicate > 1 and self.dp_shard == 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    def describe(self) -> str:
        """The layout in words, e.g. 'pp 2 x dp_replicate 1 x dp_shard 2 x tp 2 (FSDP, TP, PP)'."""
        kinds = [
            name
            for name, on in (
                ("HSDP" if self.hsdp else "FSDP", self.fsdp),
                ("DDP", self.ddp),
                ("TP", self.tp_enabled),
                ("PP", self.pp_enabled),
            )
            if on
        ]
        degrees = " x ".join(f"{k} {getattr(self, k)}" for k in DIM_ORDER)
        return f"{degrees} ({', '.join(kinds) or 'single process'})"

    # -- checks that need the model and the training config ----------------------------------------
    def check(self, cfg: ParallelConfig, shape, micro_batch: int) -> None:
        """Raise ConfigError (with a HINT) when this layout cannot split `shape` (a models.ModelShape:
        dim, n_layers, n_heads, mlp_ratio) as configured."""
        check_choice("parallel.pp_schedule", cfg.pp_schedule, PP_SCHEDULES)
        check_choice("parallel.activation_checkpoint", cfg.activation_checkpoint, AC_MODES)
        check_choice("parallel.param_dtype", cfg.param_dtype, ("fp32", "bf16"))
        if cfg.activation_checkpoint_every < 1:
            raise ConfigError(
                f"parallel.activation_checkpoint_every must be >= 1, got {cfg.activation_checkpoint_every}",
                "use e.g. --parallel.activation_checkpoint_every=2",
            )
        self._check_tp(cfg, shape)
        self._check_pp(cfg, shape, micro_batch)
        if (cfg.param_dtype != "fp32" or cfg.cpu_offload) and not self.fsdp:
            raise ConfigError(
                "parallel.param_dtype and parallel.cpu_offload are FSDP options, but this layout "
                "does not shard "
                f"(parallel.dp_shard={self.dp_shard})",
                "set --parallel.dp_shard to 2 or more (FSDP), or use --train.precision=bf16 "
                "(autocast) without FSDP",
            )

    def _check_tp(self, cfg: ParallelConfig, shape) -> None:
        if not self.tp_enabled:
            if cfg.sequence_parallel or cfg.loss_parallel:
                raise ConfigError(
                    "parallel.sequence_parallel and parallel.loss_parallel need tensor parallelism (tp > 1)",
                    "set --parallel.tp=2 or more, or turn them off",
                )
            return
        hidden = shape.mlp_ratio * shape.dim
        for what, n in (("attention heads", shape.n_heads), ("MLP width", hidden)):
            if n % self.tp:
                raise ConfigError(
                    f"parallel.tp={self.tp} does not divide the model's {what} ({n})",
                    f"pick a tp degree that divides {n}, e.g. one of {_divisors(n, self.tp)}",
                )

    def _check_pp(self, cfg: ParallelConfig, shape, micro_batch: int) -> None:
        if cfg.pp_microbatches < 0:
            raise ConfigError(
                f"parallel.pp_microbatches must be 0 (one per stage) or positive, got {cfg.pp_microbatches}",
                "use e.g. --parallel.pp_microbatches=0",
            )
        if not self.pp_enabled:
            if cfg.pp_stages_per_rank != 1 or cfg.pp_microbatches:
                raise ConfigError(
                    "parallel.pp_stages_per_rank and parallel.pp_microbatches need pipeline parallelism "
                    "(pp > 1)",
                    "set --parallel.pp=2 or more, or leave them at their defaults",
                )
            return
        spr = cfg.pp_stages_per_rank
        interleaved = cfg.pp_schedule == "interleaved_1f1b"
        if interleaved and spr < 2:
            raise ConfigError(
                f"parallel.pp_schedule=interleaved_1f1b needs several stages per rank, got "
                f"parallel.pp_stages_per_rank={spr}",
                "set --parallel.pp_stages_per_rank=2 (or more), or use --parallel.pp_schedule=1f1b",
            )
        if not interleaved and spr != 1:
            raise ConfigError(
                f"parallel.pp_schedule={cfg.pp_schedule} runs one stage per rank, got "
                f"parallel.pp_stages_per_rank={spr}",
                "use --parallel.pp_schedule=interleaved_1f1b for several stages per rank",
            )
        stages = self.pp * spr
        if stages > shape.n_layers:
            raise ConfigError(
                f"{stages} pipeline stages (pp={self.pp} x {spr} per rank) for a model with only "
                f"{shape.n_layers} blocks",
                f"use at most {shape.n_layers} stages, or a deeper model (--model.n_layers={stages})",
            )
        micro = self.microbatches(cfg)
        if micro_batch % micro:
            raise ConfigError(
                f"parallel.pp_microbatches={micro} does not divide train.micro_batch_size={micro_batch}",
                f"pick a micro batch that is a multiple of {micro}, e.g. "
                f"--train.micro_batch_size={micro * max(1, micro_batch // micro)}",
            )
        if micro < self.pp:
            raise ConfigError(
                f"{micro} pipeline microbatches for {self.pp} pipeline ranks leave ranks idle",
                f"set --parallel.pp_microbatches to at least {self.pp}",
            )
        rounds = max(1, micro // self.pp)  # torch's interleaved 1F1B runs microbatches in equal rounds
        if interleaved and micro % rounds:
            raise ConfigError(
                f"interleaved 1F1B runs pipeline microbatches in rounds of {self.pp} (one per pipeline "
                f"rank): {micro} microbatches do not split into {rounds} equal rounds",
                f"use a multiple of parallel.pp={self.pp} as --parallel.pp_microbatches, e.g. "
                f"{self.pp * rounds}",
            )

    def microbatches(self, cfg: ParallelConfig) -> int:
        """Pipeline microbatches per micro-batch: the configured number, else one per stage."""
        return cfg.pp_microbatches or self.pp * cfg.pp_stages_per_rank

    # -- the mesh (needs torch.distributed; only after the process group exists) -------------------
    def build_mesh(self, device_type: str):
        """Create the named DeviceMesh of this layout (only dimensions of degree > 1) and its
        flattened views: 'dp' (all data-parallel ranks: data loading, loss averaging) and 'fsdp'
        (what fully_shard shards over: dp_shard, or (dp_replicate, dp_shard) for HSDP)."""
        from torch.distributed.device_mesh import init_device_mesh

        object.__setattr__(self, "_sub_meshes", {})  # name -> sub-mesh; torch builds a new one per slicing
        names = [n for n in DIM_ORDER if getattr(self, n) > 1]
        if not names:
            object.__setattr__(self, "_mesh", None)
            return None
        mesh = init_device_mesh(
            device_type, tuple(getattr(self, n) for n in names), mesh_dim_names=tuple(names)
        )
        dp_names = tuple(n for n in ("dp_replicate", "dp_shard") if n in names)
        if len(dp_names) == 2:
            mesh[dp_names]._flatten("dp")
        if self.fsdp and self.tp_enabled:
            # FSDP x TP parameters live on (fsdp dims..., tp); with this flattened view DTensor reduces
            # their gradient norms (clipping) in one collective instead of one per mesh dimension
            mesh[("dp_replicate", "dp_shard", "tp") if self.hsdp else ("dp_shard", "tp")]._flatten()
        object.__setattr__(self, "_mesh", mesh)
        return mesh

    @property
    def root_mesh(self):
        """The whole named DeviceMesh built by `build_mesh` (None for a single rank or before it)."""
        return getattr(self, "_mesh", None)

    def mesh(self, name: str):
        """The sub-mesh called `name` (pp, dp_replicate, dp_shard, tp, dp, fsdp), or None when that
        dimension has degree 1. 'fsdp' is 2-D (replicate, shard) under HSDP. Cheap after the first call
        (the training step asks for 'pp' every time)."""
        root = getattr(self, "_mesh", None)
        if root is None:
            return None
        cache = self._sub_meshes
        if name not in cache:
            cache[name] = self._slice(root, name)
        return cache[name]

    def _slice(self, root, name: str):
        if name == "fsdp":
            if not self.fsdp:
                return None
            return root[("dp_replicate", "dp_shard")] if self.hsdp else root["dp_shard"]
        if name == "dp":
            if self.dp == 1:
                return None
            return root["dp"] if self.hsdp else root["dp_shard" if self.fsdp else "dp_replicate"]
        if name not in DIM_ORDER:
            raise ValueError(f"unknown mesh name {name!r}; known: {', '.join(DIM_ORDER + ('dp', 'fsdp'))}")
        return root[name] if getattr(self, name) > 1 else None

    def coordinate(self, name: str) -> int:
        """This rank's index along `name` (0 when that dimension has degree 1)."""
        m = self.mesh(name)
        return 0 if m is None else m.get_local_rank()

    def degrees(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "world_size"}


def _formula(degrees: dict[str, int]) -> str:
    return " x ".join(f"{k} {'?' if v == -1 else v}" for k, v in degrees.items())


def _divisors(n: int, around: int) -> str:
    return ", ".join(str(d) for d in range(1, min(n, 4 * around) + 1) if n % d == 0)
