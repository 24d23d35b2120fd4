"""The job spec: what a user asks SLURM for, checked before any script is written. Never imports torch."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from exatrain.config.load import config_from_dict
from exatrain.config.schema import JobConfig
from exatrain.errors import ConfigError
from exatrain.launch.profiles import SiteProfile

LAUNCH_MODES = ("srun", "torchrun")
_TIME = re.compile(r"(?:(\d+)-)?(\d+):([0-5]\d):([0-5]\d)")
_SIGNAL = re.compile(r"(?:B:)?[A-Z][A-Z0-9]*@\d+")
_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f]")  # newlines would end an #SBATCH line and start a shell line


@dataclass(frozen=True)
class JobSpec(JobConfig):
    """One SLURM job of exatrain ranks: the ``[job]`` config section, checked (fields are JobConfig's)."""

    def __post_init__(self) -> None:
        self._check()

    @classmethod
    def from_config(cls, job: JobConfig) -> JobSpec:
        """The checked spec of a loaded ``[job]`` section (raises ConfigError for values that cannot work)."""
        return cls(**{f.name: getattr(job, f.name) for f in fields(JobConfig)})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "[job]") -> JobSpec:
        """Build a spec from a parsed ``[job]`` table, through the one config loader (same types and errors)."""
        return cls.from_config(config_from_dict({"job": dict(data)}, source).job)

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
        if "/" in self.name or not self.name.strip():
            raise ConfigError(f"job.name = {self.name!r} is empty or contains '/'",
                              "SLURM puts the name into file names (%x in job.output); use e.g. \"gpt-small\"")
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

