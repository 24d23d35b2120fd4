"""Site profiles: what a cluster's nodes look like and how jobs should be wired there, as TOML data files.

Bundled profiles live in ``exatrain/slurm/profiles/<name>.toml``; a user copies one, edits it and passes
its path instead of the name. Never imports torch and never reads cluster environment variables.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from exatrain.config.load import read_toml
from exatrain.errors import ConfigError
from exatrain.slurm.presets import Preset, check_single_node_safe, parse_presets
from exatrain.slurm.timefmt import parse_slurm_time

PROFILE_DIR = Path(__file__).with_name("profiles")
VENDORS = ("nvidia", "amd", "none")
VISIBILITIES = ("gpus-per-task", "gpus-per-node")
RUNTIMES = ("singularity", "apptainer")
RULES = {  # billing rule kind -> the parameters it needs
    "whole-node": ("units_per_node_hour",),
    "gpu-slot": ("units_per_gpu_hour", "cores_per_gpu", "mem_gb_per_gpu"),
    "gpu-hours": ("units_per_gpu_hour",),
    "core-hours": ("units_per_core_hour",),
}


def _f(help: str, default: Any = None):
    return (
        field(metadata={"help": help}) if default is None else field(default=default, metadata={"help": help})
    )


@dataclass(frozen=True)
class BillingRule:
    """How one group of partitions charges a job (see exatrain.slurm.billing)."""

    rule: str = _f("Kind: " + ", ".join(RULES) + ".")
    partitions: tuple[str, ...] = _f(
        "Partitions it applies to; empty = every partition without its own rule.", ()
    )
    unit: str = _f("Name of the billed unit, e.g. GPU-hours.", "GPU-hours")
    units_per_node_hour: float = _f("whole-node: units per allocated node-hour.", 0.0)
    units_per_gpu_hour: float = _f(
        "gpu-slot, gpu-hours: units per GPU-hour (gpu-slot: per charged GPU slot).", 0.0
    )
    units_per_core_hour: float = _f("core-hours: units per allocated core-hour.", 0.0)
    cores_per_gpu: int = _f("gpu-slot: every this many cores are charged as one GPU.", 0)
    mem_gb_per_gpu: float = _f("gpu-slot: every this many GB of memory are charged as one GPU.", 0.0)


@dataclass(frozen=True)
class Partition:
    """What one partition allows a job (the site's documented limits; 0 or empty = not known, not checked)."""

    name: str = _f("Partition name as SLURM knows it.")
    whole_nodes: bool = _f(
        "True where SLURM allocates (and the site bills) whole nodes whatever the job asks for; "
        "false on shared partitions, where a job gets only the cores, GPUs and memory it asks for.",
        False,
    )
    max_nodes: int = _f("Most nodes one job may have; 0 = not known.", 0)
    max_time: str = _f("Longest time limit, [D-]HH:MM:SS; empty = not known.", "")
    mem_per_node_gb: int = _f("Memory a job may ask for per node in GB; 0 = not known.", 0)


HARDWARE_SOURCES = ("", "published", "measured")


@dataclass(frozen=True)
class Hardware:
    """[hardware]: the constants `exatrain plan --time` predicts a step from (0 = not known)."""

    peak_tflops: float = _f(
        "Dense bf16 peak TFLOP/s of one GPU from its data sheet (MFU's denominator).", 0.0
    )
    matmul_tflops: float = _f("TFLOP/s one GPU reaches on large bf16 matrix products, measured.", 0.0)
    attention_tflops: float = _f(
        "TFLOP/s of the fused attention kernel (causal, forward + backward, counted as 12 B H T^2 d: no "
        "causal halving), measured; 0 = at matmul_tflops.",
        0.0,
    )
    intra_node_busbw_gbs: float = _f("All-reduce bus bandwidth (nccl-tests' busbw) within a node, GB/s.", 0.0)
    inter_node_busbw_gbs: float = _f("All-reduce bus bandwidth (nccl-tests' busbw) across nodes, GB/s.", 0.0)
    intra_node_busbw_curve: tuple[tuple[float, float], ...] = _f(
        "Optional: nccl-tests' all-reduce busbw within a node by message size, [[bytes, GB/s], ...] in "
        "increasing size (measured); a collective of S bytes per call then runs at the curve's busbw at S "
        "(interpolated in log size, the end points' beyond), small messages below the large ones' busbw. "
        "Empty = intra_node_busbw_gbs at every size.",
        (),
    )
    inter_node_busbw_curve: tuple[tuple[float, float], ...] = _f(
        "Optional: as intra_node_busbw_curve, across nodes (a run of whole nodes). Empty = "
        "inter_node_busbw_gbs at every size.",
        (),
    )
    hbm_gbs: float = _f(
        "Memory bandwidth of one GPU, GB/s (the optimizer step's time); 0 = not modelled.", 0.0
    )
    source: str = _f(
        "Where the constants come from: 'published' (data sheets and public measurements, each cited in the "
        "profile's comments: not this allocation's), 'measured' (exatrain doctor on the machine), or empty "
        "(not said). `exatrain plan --time` says which.",
        "",
    )

    def missing(self, keys: tuple[str, ...]) -> list[str]:
        """The keys of `keys` that are not set (0)."""
        return [k for k in keys if not getattr(self, k)]


@dataclass(frozen=True)
class SiteProfile:
    """One cluster's node shape, bindings, communication presets, caches and billing rules."""

    name: str = _f("Profile name (the file's stem for bundled ones).")
    gpu_vendor: str = _f("nvidia, amd or none (selects the smoke-test tools and the cache set).")
    gpus_per_node: int = _f("GPUs per node as SLURM counts them (LUMI: GCDs); 0 on CPU nodes.")
    cores_per_node: int = _f("Physical cores per node.")
    usable_cores: int = _f("Cores a job may use (LUMI-G reserves one per CCD).")
    default_cpus_per_gpu: int = _f("Cores per rank when the job spec says 0.")
    default_mem_per_gpu_gb: int = _f("--mem-per-gpu in GB when the job spec says 0; 0 = no such line.")
    partition: str = _f("Default partition; empty = the site's default.")
    visibility: str = _f("srun mode binding: gpus-per-task (one GPU visible per rank) or gpus-per-node.")
    cpu_masks: tuple[str, ...] = _f(
        "Hex CPU mask of each local GPU, in GPU order (CPU nodes: of each local rank); "
        "empty = SLURM's binding."
    )
    master_suffix: str = _f("Appended to the master host name (JSC: 'i' = InfiniBand address).")
    node_local_tmp: str = _f("Node-local directory for per-node caches.")
    container_runtime: str = _f("singularity or apptainer (command and *ENV_ prefix).")
    comm_env: tuple[tuple[str, str], ...] = _f("Communication presets exported in every job, sorted by name.")
    caches: tuple[tuple[str, str], ...] = _f("Cache variable -> sub-directory of the node-local cache dir.")
    billing: tuple[BillingRule, ...] = _f("Billing rules, tried in order (see exatrain.slurm.billing).")
    gpu_memory_gb: float = _f(
        "Memory of one GPU in GiB (LUMI: one MI250X GCD); 0 = unknown. Used by `exatrain plan`.", 0.0
    )
    partitions: tuple[Partition, ...] = _f(
        "[[partitions]] tables: limits and allocation mode of known partitions.", ()
    )
    container_binds: tuple[str, ...] = _f(
        "Host paths every container must see (LUMI: the Slingshot/CXI libraries "
        "and slurmd's spool directory, so RCCL uses the high-speed network).",
        (),
    )
    presets: tuple[Preset, ...] = _f(
        "[[presets]] groups: environment per container generation (first group whose "
        'images patterns match job.container_image; "" = no container).',
        (),
    )
    multi_node_env: tuple[tuple[str, str], ...] = _f(
        "Exported only in jobs of more than one node (NCCL_NET).", ()
    )
    container_env: tuple[tuple[str, str], ...] = _f(
        "Exported only in jobs with a container: what the site's container bindings module sets besides its "
        "binds (LUMI: SLURM_MPI_TYPE).",
        (),
    )
    hardware: Hardware | None = field(
        default=None,
        metadata={
            "help": "[hardware] table: performance constants for `exatrain plan --time`; absent = not known."
        },
    )

    def partition_named(self, name: str) -> Partition | None:
        """The [[partitions]] entry of ``name`` (None when the profile does not describe it)."""
        return next((p for p in self.partitions if p.name == name), None)

    @property
    def cpu_ranks_per_node(self) -> int:
        """Most ranks a node can hold: its GPUs, or on CPU nodes its usable cores."""
        return self.gpus_per_node or self.usable_cores


def bundled_profiles() -> list[str]:
    """Names of the profiles shipped with exatrain."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))


def is_profile_path(name_or_path: str) -> bool:
    """Whether a profile is given as a file path (``./site.toml``) rather than a bundled name."""
    return name_or_path.endswith(".toml") or "/" in name_or_path


def load_profile(name_or_path: str) -> SiteProfile:
    """Load a bundled profile by name (``lumi-g``) or a user's profile file by path (``./my-site.toml``)."""
    path = Path(name_or_path)
    if is_profile_path(name_or_path):
        if not path.is_file():
            raise ConfigError(
                f"site profile file {name_or_path!r} does not exist",
                f"pass a bundled profile name ({', '.join(bundled_profiles())}) or an existing .toml file",
            )
        source = str(path)
    else:
        if name_or_path not in bundled_profiles():
            raise ConfigError(
                f"unknown site profile {name_or_path!r}",
                f"bundled profiles: {', '.join(bundled_profiles())}; or pass the path of your own .toml "
                f"(copy one from {PROFILE_DIR})",
            )
        source = str(PROFILE_DIR / f"{name_or_path}.toml")
    return profile_from_dict(read_toml(source), source)


def profile_from_dict(data: dict[str, Any], source: str = "profile") -> SiteProfile:
    """Check a parsed profile table and build the SiteProfile; unknown keys and wrong types raise
    ConfigError."""
    _check_keys(data, SiteProfile, source, "the profile")
    values = {}
    for key in (
        "name",
        "gpu_vendor",
        "partition",
        "visibility",
        "master_suffix",
        "node_local_tmp",
        "container_runtime",
    ):
        values[key] = _typed(data, key, str, source)
    for key in (
        "gpus_per_node",
        "cores_per_node",
        "usable_cores",
        "default_cpus_per_gpu",
        "default_mem_per_gpu_gb",
    ):
        values[key] = _typed(data, key, int, source)
    values["cpu_masks"] = tuple(_str_list(data, "cpu_masks", source))
    values["container_binds"] = tuple(_str_list(data, "container_binds", source))
    values["comm_env"] = _with_gloo_interfaces(_str_table(data, "comm_env", source), source)
    values["caches"] = _str_table(data, "caches", source)
    values.update(_job_dependent_env(data, source))
    rules = data.get("billing")
    if not isinstance(rules, list) or not rules:
        raise ConfigError(
            f"{source}: billing must be a list of [[billing]] tables",
            'add at least one [[billing]] table, e.g. rule = "gpu-hours" with units_per_gpu_hour = 1.0',
        )
    values["gpu_memory_gb"] = _typed(data, "gpu_memory_gb", float, source, 0.0)
    values["billing"] = tuple(_rule(r, f"{source} [[billing]] #{i + 1}") for i, r in enumerate(rules))
    tables = data.get("partitions", [])
    if not isinstance(tables, list):
        raise ConfigError(
            f"{source}: partitions must be a list of [[partitions]] tables", "write [[partitions]] tables"
        )
    values["partitions"] = tuple(
        _partition(t, f"{source} [[partitions]] #{i + 1}") for i, t in enumerate(tables)
    )
    values["hardware"] = _hardware(data["hardware"], f"{source} [hardware]") if "hardware" in data else None
    profile = SiteProfile(**values)
    _check_values(profile, source)
    return profile


def _job_dependent_env(data: dict[str, Any], source: str) -> dict[str, Any]:
    """[[presets]], [multi_node_env] and [container_env] (exatrain.slurm.presets): presets that depend on the
    job."""
    check_single_node_safe(_str_table(data, "comm_env", source), f"{source}: [comm_env]")
    return {
        "presets": parse_presets(data.get("presets"), source, _str_table),
        "multi_node_env": _str_table(data, "multi_node_env", source),
        "container_env": _str_table(data, "container_env", source),
    }


def _check_keys(data: Any, cls: type, source: str, what: str) -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: {what} must be a table", "write key = value lines")
    valid = [f.name for f in fields(cls)]
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise ConfigError(
            f"{source}: unknown key(s) {', '.join(map(repr, unknown))} in {what}",
            f"valid keys: {', '.join(valid)}",
        )
    missing = [f.name for f in fields(cls) if f.name not in data and _required(f)]
    if missing:
        raise ConfigError(
            f"{source}: {what} lacks {', '.join(missing)}",
            f"copy a bundled profile from {PROFILE_DIR} and edit it; every key is documented there",
        )


def _required(f) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def _typed(data: dict[str, Any], key: str, kind: type, source: str, default: Any = None) -> Any:
    value = data.get(key, default)
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        raise ConfigError(
            f"{source}: {key} must be {kind.__name__}, got {value!r}",
            f"write {key} as a TOML {kind.__name__}, as in the bundled profiles",
        )
    return value


def _str_list(data: dict[str, Any], key: str, source: str) -> list[str]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(
            f"{source}: {key} must be a list of strings, got {value!r}", f'write {key} = ["a", "b"]'
        )
    return value


def _str_table(data: dict[str, Any], key: str, source: str) -> tuple[tuple[str, str], ...]:
    value = data.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ConfigError(
            f"{source}: [{key}] must be a table of strings, got {value!r}",
            f'write [{key}] followed by NAME = "value" lines (quote numbers too)',
        )
    for name in value:
        if not name.isidentifier():
            raise ConfigError(
                f"{source}: [{key}] name {name!r} is not a valid environment variable name",
                "use letters, digits and underscores, not starting with a digit",
            )
    return tuple(sorted(value.items()))


def _with_gloo_interfaces(env: tuple[tuple[str, str], ...], source: str) -> tuple[tuple[str, str], ...]:
    """Where a profile names NCCL's interfaces, gloo (CPU groups, async saves) must use the same ones.

    A plain list of interface names is copied to GLOO_SOCKET_IFNAME; NCCL's prefix syntax (``^`` to exclude,
    ``=`` for exact names) means nothing to gloo, so such a value needs an explicit GLOO_SOCKET_IFNAME.
    """
    table = dict(env)
    nccl = table.get("NCCL_SOCKET_IFNAME")
    if nccl is None or "GLOO_SOCKET_IFNAME" in table:
        return env
    if nccl.startswith(("^", "=")):
        raise ConfigError(
            f"{source}: [comm_env] sets NCCL_SOCKET_IFNAME = {nccl!r} but no GLOO_SOCKET_IFNAME",
            "add GLOO_SOCKET_IFNAME with the interface names gloo should use (a comma-separated "
            'list of exact names, e.g. "ib0,ib1")',
        )
    table["GLOO_SOCKET_IFNAME"] = nccl
    return tuple(sorted(table.items()))


def _rule(data: Any, source: str) -> BillingRule:
    _check_keys(data, BillingRule, source, "the billing rule")
    kind = _typed(data, "rule", str, source)
    if kind not in RULES:
        raise ConfigError(f"{source}: unknown billing rule {kind!r}", f"valid rules: {', '.join(RULES)}")
    for param in RULES[kind]:
        if not data.get(param):
            raise ConfigError(
                f"{source}: rule {kind!r} needs {param} > 0", f"rule {kind!r} uses: {', '.join(RULES[kind])}"
            )
    return BillingRule(
        rule=kind,
        partitions=tuple(_str_list(data, "partitions", source)),
        unit=_typed(data, "unit", str, source, "GPU-hours"),
        units_per_node_hour=_typed(data, "units_per_node_hour", float, source, 0.0),
        units_per_gpu_hour=_typed(data, "units_per_gpu_hour", float, source, 0.0),
        units_per_core_hour=_typed(data, "units_per_core_hour", float, source, 0.0),
        cores_per_gpu=_typed(data, "cores_per_gpu", int, source, 0),
        mem_gb_per_gpu=_typed(data, "mem_gb_per_gpu", float, source, 0.0),
    )


def _hardware(data: Any, source: str) -> Hardware:
    _check_keys(data, Hardware, source, "the hardware table")
    origin = _typed(data, "source", str, source, "")
    if origin not in HARDWARE_SOURCES:
        raise ConfigError(
            f"{source}: source = {origin!r} is not one of {', '.join(map(repr, HARDWARE_SOURCES))}",
            'write source = "measured" for values exatrain doctor measured on the machine, "published" for '
            "data-sheet and published figures (cite each in a comment), or leave it out",
        )
    values = {
        f.name: _typed(data, f.name, float, source, 0.0)
        for f in fields(Hardware)
        if f.name != "source" and not f.name.endswith("_curve")
    }
    for key, value in values.items():
        if value < 0:
            raise ConfigError(
                f"{source}: {key} = {value:g} is negative",
                f"write {key} as a positive number, or leave it out when it is not known",
            )
    curves = {key: _curve(data, key, source) for key in ("intra_node_busbw_curve", "inter_node_busbw_curve")}
    return Hardware(**values, **curves, source=origin)


def _curve(data: Any, key: str, source: str) -> tuple[tuple[float, float], ...]:
    """A busbw-by-size table, [[bytes, GB/s], ...]: pairs of positive numbers in increasing size."""
    raw = data.get(key, [])
    hint = f"write {key} = [[1048576, 36.2], [4194304, 71.4], ...]: message bytes and busbw GB/s, in "
    hint += "increasing size"
    if not isinstance(raw, list) or not all(
        isinstance(p, list)
        and len(p) == 2
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in p)
        for p in raw
    ):
        raise ConfigError(f"{source}: {key} is not a list of [bytes, GB/s] pairs", hint)
    pairs = tuple((float(b), float(g)) for b, g in raw)
    if any(b <= 0 or g <= 0 for b, g in pairs) or any(a[0] >= b[0] for a, b in zip(pairs, pairs[1:])):
        raise ConfigError(f"{source}: {key} needs positive values in increasing size", hint)
    return pairs


def _partition(data: Any, source: str) -> Partition:
    _check_keys(data, Partition, source, "the partition")
    part = Partition(
        name=_typed(data, "name", str, source),
        whole_nodes=_typed(data, "whole_nodes", bool, source, False),
        max_nodes=_typed(data, "max_nodes", int, source, 0),
        max_time=_typed(data, "max_time", str, source, ""),
        mem_per_node_gb=_typed(data, "mem_per_node_gb", int, source, 0),
    )
    if part.max_time and not parse_slurm_time(part.max_time):
        raise ConfigError(
            f"{source}: max_time = {part.max_time!r} is not a SLURM time",
            'write [D-]HH:MM:SS, e.g. "2-00:00:00"',
        )
    return part


def _check_values(p: SiteProfile, source: str) -> None:
    def bad(what: str, hint: str) -> None:
        raise ConfigError(f"{source}: {what}", hint)

    if p.gpu_vendor not in VENDORS:
        bad(
            f"gpu_vendor {p.gpu_vendor!r} is not one of {', '.join(VENDORS)}",
            "use nvidia, amd or none (CPU nodes)",
        )
    if (p.gpu_vendor == "none") != (p.gpus_per_node == 0):
        bad(
            f"gpu_vendor {p.gpu_vendor!r} does not fit gpus_per_node = {p.gpus_per_node}",
            'CPU nodes: gpu_vendor = "none" and gpus_per_node = 0; GPU nodes: a vendor and a count >= 1',
        )
    if p.visibility not in VISIBILITIES:
        bad(f"visibility {p.visibility!r} is not one of {', '.join(VISIBILITIES)}", "pick one of those")
    if p.container_runtime not in RUNTIMES:
        bad(
            f"container_runtime {p.container_runtime!r} is not one of {', '.join(RUNTIMES)}",
            "pick one of those",
        )
    if not 1 <= p.usable_cores <= p.cores_per_node:
        bad(
            f"usable_cores = {p.usable_cores} must be from 1 to cores_per_node = {p.cores_per_node}",
            "count the cores a job may use (minus reserved ones)",
        )
    if (
        p.default_cpus_per_gpu < 1
        or p.default_cpus_per_gpu * p.cpu_ranks_per_node > p.usable_cores
        and p.gpus_per_node
    ):
        bad(
            f"default_cpus_per_gpu = {p.default_cpus_per_gpu} x {p.gpus_per_node} GPUs exceeds "
            f"{p.usable_cores} usable cores",
            "use usable_cores // gpus_per_node or less",
        )
    if p.cpu_masks and p.gpus_per_node and len(p.cpu_masks) != p.gpus_per_node:
        bad(
            f"cpu_masks has {len(p.cpu_masks)} entries for {p.gpus_per_node} GPUs",
            "give one hex mask per local GPU in GPU order, or none",
        )
    for mask in p.cpu_masks:
        try:
            ok = mask.lower().startswith("0x") and int(mask, 16) > 0
        except ValueError:
            ok = False
        if not ok:
            bad(f"cpu mask {mask!r} is not a hex mask", 'write masks like "0xfe" (cores 1-7)')
