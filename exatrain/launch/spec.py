"""The job spec: what a user asks SLURM for, checked before any script is written. Never imports torch."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from exatrain.errors import ConfigError
from exatrain.launch.profiles import SiteProfile

LAUNCH_MODES = ("srun", "torchrun")
_TIME = re.compile(r"(?:(\d+)-)?(\d+):([0-5]\d):([0-5]\d)")
_SIGNAL = re.compile(r"(?:B:)?[A-Z][A-Z0-9]*@\d+")
_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f]")  # newlines would end an #SBATCH line and start a shell line


def _f(default: Any, help: str):
    return field(default=default, metadata={"help": help})  # defaults are immutable (str, int, tuple)


@dataclass(frozen=True)
class JobSpec:
    """One SLURM job of exatrain ranks (the ``[job]`` TOML section)."""

    nodes: int = _f(1, "Nodes to allocate (>= 1).")
    gpus_per_node: int = _f(0, "GPUs (ranks) per node; 0 = all of the profile's GPUs. CPU profile: ranks per node.")
    cpus_per_task: int = _f(0, "CPU cores per rank (one rank per GPU); 0 = the profile's default. "
                               "torchrun mode asks for this times the ranks per node for its one task per node.")
    mem_per_gpu_gb: int = _f(0, "Memory per GPU in GB (--mem-per-gpu); 0 = the profile's default (may be none).")
    time: str = _f("00:30:00", "Time limit: HH:MM:SS, D-HH:MM:SS or whole minutes (\"90\"; an integer in TOML).")
    partition: str = _f("", "SLURM partition; empty = the profile's default partition.")
    account: str = _f("", "Project/account to charge (LUMI: project_465000123); empty = none given.")
    reservation: str = _f("", "SLURM reservation; empty = none.")
    qos: str = _f("", "Quality of service; empty = none.")
    name: str = _f("exatrain", "Job name (%x in output patterns).")
    output: str = _f("%x-%j.out", "stdout file pattern (%x = job name, %j = job id).")
    error: str = _f("", "stderr file pattern; empty = together with stdout.")
    extra_sbatch: tuple[str, ...] = _f((), "Extra sbatch flags written verbatim as #SBATCH lines, e.g. \"--exclusive\".")
    env: tuple[tuple[str, str], ...] = _f((), "Extra environment (a TOML table NAME = \"value\"; stored as sorted "
                                              "(name, value) pairs); wins over the profile's presets.")
    container_image: str = _f("", "Singularity/Apptainer image to run the ranks in; empty = no container.")
    container_binds: tuple[str, ...] = _f((), "Extra --bind paths for the container (src[:dst[:opts]]).")
    launch: str = _f("srun", "srun = one task per GPU started by srun; torchrun = one task per node running "
                             "torchrun with c10d rendezvous on the first node.")
    profile: str = _f("generic-nvidia", "Site profile name (bundled) or path of a profile TOML file.")
    command: tuple[str, ...] = _f(("exatrain", "train"), "What each rank runs.")
    signal: str = _f("USR2@120", "Signal sent this many seconds before the time limit (checkpointing); "
                                 "empty = none. Without B: it reaches the ranks, with B: only the batch shell.")

    def __post_init__(self) -> None:
        self._check()

    @classmethod
    def keys(cls) -> list[str]:
        """The valid keys of the [job] section."""
        return [f.name for f in fields(cls)]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "[job]") -> JobSpec:
        """Build a spec from a parsed ``[job]`` table; unknown keys and wrong types raise ConfigError."""
        unknown = sorted(set(data) - set(cls.keys()))
        if unknown:
            raise ConfigError(f"unknown job key(s) {', '.join(map(repr, unknown))} in {source}",
                              "valid keys of [job]: " + ", ".join(cls.keys()))
        values = {key: _coerce(f, data[f.name], source) for f in fields(cls) if (key := f.name) in data}
        return cls(**values)

    def minutes(self) -> int:
        """The time limit in whole minutes (SLURM's resolution), rounded up."""
        if self.time.isdigit():
            return int(self.time)
        days, h, m, s = _TIME.fullmatch(self.time).groups()  # type: ignore[union-attr]
        return int(days or 0) * 1440 + int(h) * 60 + int(m) + (1 if int(s) else 0)

    def slurm_time(self) -> str:
        """The time limit as SLURM's [D-]HH:MM:SS."""
        if not self.time.isdigit():
            return self.time
        minutes = int(self.time)
        return f"{minutes // 60:02d}:{minutes % 60:02d}:00"

    def ranks_per_node(self, profile: SiteProfile) -> int:
        """GPUs (ranks) per node after applying the profile default."""
        return self.gpus_per_node or profile.gpus_per_node or 1

    def cpus(self, profile: SiteProfile) -> int:
        """Cores per rank after applying the profile default."""
        return self.cpus_per_task or profile.default_cpus_per_gpu

    def mem_gb(self, profile: SiteProfile) -> int:
        """Memory per GPU in GB after applying the profile default (0 = no --mem-per-gpu)."""
        return self.mem_per_gpu_gb or profile.default_mem_per_gpu_gb

    def check_against(self, profile: SiteProfile) -> None:
        """Checks that need the site: GPUs and cores per node must fit a node of the profile."""
        ranks, cpus = self.ranks_per_node(profile), self.cpus(profile)
        limit = profile.cpu_ranks_per_node
        if ranks > limit:
            what = "GPUs" if profile.gpus_per_node else "usable cores"
            raise ConfigError(f"job.gpus_per_node = {ranks} exceeds the {limit} {what} per node of profile {profile.name!r}",
                              f"ask for at most {limit} per node and more nodes (job.nodes) instead")
        if ranks * cpus > profile.usable_cores:
            raise ConfigError(
                f"{ranks} ranks x {cpus} cores (job.cpus_per_task) = {ranks * cpus} cores exceed the "
                f"{profile.usable_cores} usable cores per node of profile {profile.name!r}",
                f"use job.cpus_per_task <= {profile.usable_cores // ranks}, or 0 for the profile default "
                f"({profile.default_cpus_per_gpu})")

    def _check(self) -> None:
        if self.nodes < 1:
            raise ConfigError(f"job.nodes must be at least 1, got {self.nodes}", "set job.nodes = 1 or more")
        for key in ("gpus_per_node", "cpus_per_task", "mem_per_gpu_gb"):
            if getattr(self, key) < 0:
                raise ConfigError(f"job.{key} must be >= 0, got {getattr(self, key)}",
                                  "use 0 for the profile's default or a positive number")
        if self.launch not in LAUNCH_MODES:
            raise ConfigError(f"job.launch = {self.launch!r} is not a launch mode",
                              "use \"srun\" (one task per GPU) or \"torchrun\" (one task per node, c10d rendezvous)")
        if not (self.time.isdigit() and int(self.time) > 0) and not _TIME.fullmatch(self.time):
            raise ConfigError(f"job.time = {self.time!r} is not a time limit",
                              "write HH:MM:SS (\"02:00:00\"), D-HH:MM:SS (\"1-00:00:00\") or whole minutes (120)")
        if self.minutes() < 1:
            raise ConfigError(f"job.time = {self.time!r} is shorter than a minute", "SLURM limits are whole minutes")
        if self.signal and not _SIGNAL.fullmatch(self.signal):
            raise ConfigError(f"job.signal = {self.signal!r} is not SIG@SECONDS",
                              "write e.g. \"USR2@120\" (ranks) or \"B:USR2@120\" (batch shell only); empty = none")
        if not self.command:
            raise ConfigError("job.command is empty", "give what each rank runs, e.g. [\"exatrain\", \"train\"]")
        for flag in self.extra_sbatch:
            if not flag.startswith("--"):
                raise ConfigError(f"job.extra_sbatch entry {flag!r} is not a long flag",
                                  "write full flags such as \"--exclusive\" or \"--constraint=a100\"")
        for key, value in self.env:
            if not key.isidentifier():
                raise ConfigError(f"job.env name {key!r} is not a valid variable name",
                                  "use letters, digits and underscores, not starting with a digit")
        self._check_no_control_chars()

    def _check_no_control_chars(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            texts = [value] if isinstance(value, str) else [
                t for v in (value if isinstance(value, tuple) else ()) for t in (v if isinstance(v, tuple) else (v,))]
            for text in texts:
                if isinstance(text, str) and _FORBIDDEN.search(text):
                    raise ConfigError(f"job.{f.name} contains a control character (newline, tab, ...): {text!r}",
                                      "remove it: a newline would end the #SBATCH line and start a new script line")


def _coerce(f, value: Any, source: str) -> Any:
    name, kind = f.name, f.type
    def wrong(example: str) -> ConfigError:
        return ConfigError(f"job.{name} in {source} must be {kind}, got {value!r} ({type(value).__name__})",
                           f"write it as e.g. {name} = {example}")
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong("2")
        return value
    if kind == "str":
        if name == "time" and isinstance(value, int) and not isinstance(value, bool):
            return str(value)  # whole minutes
        if not isinstance(value, str):
            raise wrong('"text"')
        return value
    if name == "env":
        if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
            raise ConfigError(f"job.env in {source} must be a table of strings, got {value!r}",
                              'write [job.env] followed by NAME = "value" lines (quote numbers too)')
        return tuple(sorted((str(k), v) for k, v in value.items()))
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise wrong('["a", "b"]')
    return tuple(value)

