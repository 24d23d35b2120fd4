"""The job spec: what a user asks SLURM for, checked before any script is written. Never imports torch."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from exatrain.config.load import config_from_dict
from exatrain.config.schema import JobConfig
from exatrain.errors import ConfigError
from exatrain.slurm.profiles import SiteProfile
from exatrain.slurm.rank_command import can_label
from exatrain.slurm.timefmt import format_slurm_time, parse_slurm_time

LAUNCH_MODES = ("srun", "torchrun")
_SIGNAL = re.compile(r"(?:B:)?[A-Z][A-Z0-9]*@\d+")
# Beyond these a value is a typo, not a job (the largest GPU systems have some 10 000 nodes).
_ABSURD = {"nodes": 100_000, "gpus_per_node": 64, "cpus_per_task": 1024, "mem_per_gpu_gb": 8192}
_MAX_DAYS = 365
# Flags exatrain writes itself, with their aliases; an
# extra_sbatch entry naming one duplicates or contradicts it.
_GENERATED = {
    "--partition": "job.partition",
    "--time": "job.time",
    "--nodes": "job.nodes",
    "--job-name": "job.name",
    "--account": "job.account",
    "--qos": "job.qos",
    "--reservation": "job.reservation",
    "--signal": "job.signal",
    "--output": "job.output",
    "--error": "job.error",
    "--ntasks-per-node": "job.gpus_per_node and job.launch",
    "--cpus-per-task": "job.cpus_per_task",
    "--gpus-per-node": "job.gpus_per_node",
    "--gpus-per-task": "job.gpus_per_node",
    "--mem-per-gpu": "job.mem_per_gpu_gb",
    "--array": "--array on the command line",
    "--open-mode": "nothing (exatrain needs append for requeue)",
    "--requeue": "nothing (the job requeues itself after a pre-timeout checkpoint)",
}
# Flags SLURM refuses or resolves silently next to the generated ones (memory and GPU requests are exclusive).
_CONFLICTS = {
    "--mem": "--mem-per-gpu",
    "--mem-per-cpu": "--mem-per-gpu",
    "--gres": "--gpus-per-node/--gpus-per-task",
    "--gpus": "--gpus-per-node/--gpus-per-task",
    "--ntasks": "--ntasks-per-node",
    "--cpus-per-gpu": "--cpus-per-task",
}
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
        """Build a spec from a parsed ``[job]`` table, through the one config loader (same types and
        errors)."""
        return cls.from_config(config_from_dict({"job": dict(data)}, source).job)

    def seconds(self) -> int:
        """The time limit in seconds, from any of sbatch's forms (minutes, minutes:seconds,
        hours:minutes:seconds, days-hours, days-hours:minutes, days-hours:minutes:seconds)."""
        seconds = parse_slurm_time(str(self.time))
        assert seconds is not None, "checked in _check"
        return seconds

    def minutes(self) -> int:
        """The time limit in whole minutes (SLURM's resolution), rounded up."""
        return -(-self.seconds() // 60)

    def slurm_time(self) -> str:
        """The time limit as [D-]HH:MM:SS (one unambiguous form in the script)."""
        return format_slurm_time(self.seconds())

    def signal_lead(self) -> int:
        """Seconds before the time limit at which job.signal is sent (0 = no signal)."""
        return int(self.signal.rsplit("@", 1)[1]) if self.signal else 0

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
            raise ConfigError(
                f"job.gpus_per_node = {ranks} exceeds the {limit} {what} per node of profile "
                f"{profile.name!r}",
                f"ask for at most {limit} per node and more nodes (job.nodes) instead",
            )
        if ranks * cpus > profile.usable_cores:
            raise ConfigError(
                f"{ranks} ranks x {cpus} cores (job.cpus_per_task) = {ranks * cpus} cores exceed the "
                f"{profile.usable_cores} usable cores per node of profile {profile.name!r}",
                f"use job.cpus_per_task <= {profile.usable_cores // ranks}, or 0 for the profile default "
                f"({profile.default_cpus_per_gpu})",
            )
        self._check_partition_limits(profile)

    def _check_partition_limits(self, profile: SiteProfile) -> None:
        """The partition's documented limits (profile [[partitions]]): nodes, time and memory per node."""
        name = self.partition or profile.partition
        part = profile.partition_named(name)
        if part is None:
            return
        others = ", ".join(p.name for p in profile.partitions if p.name != name)
        if part.max_nodes and self.nodes > part.max_nodes:
            raise ConfigError(
                f"job.nodes = {self.nodes} exceeds the {part.max_nodes} nodes a job may have on "
                f"partition {name!r} (profile {profile.name!r})",
                f"use at most {part.max_nodes} nodes there, or another partition ({others})",
            )
        limit = parse_slurm_time(part.max_time) if part.max_time else None
        if limit and self.seconds() > limit:
            raise ConfigError(
                f"job.time = {self.time!r} exceeds the {part.max_time} limit of partition {name!r} "
                f"(profile {profile.name!r})",
                f"ask for at most {part.max_time} and resume from the checkpoint in a follow-up job "
                '(checkpoint.resume = "auto"), or use another partition',
            )
        per_node = self.ranks_per_node(profile) * self.mem_gb(profile)
        if part.mem_per_node_gb and per_node > part.mem_per_node_gb:
            raise ConfigError(
                f"{self.ranks_per_node(profile)} GPUs x {self.mem_gb(profile)} GB (job.mem_per_gpu_gb) = "
                f"{per_node} GB per node exceed the {part.mem_per_node_gb} GB a job may have per node on "
                f"partition {name!r}",
                f"use job.mem_per_gpu_gb <= {part.mem_per_node_gb // self.ranks_per_node(profile)}, "
                "or 0 for the profile default",
            )

    def _check(self) -> None:
        if self.nodes < 1:
            raise ConfigError(f"job.nodes must be at least 1, got {self.nodes}", "set job.nodes = 1 or more")
        for key in ("gpus_per_node", "cpus_per_task", "mem_per_gpu_gb"):
            if getattr(self, key) < 0:
                raise ConfigError(
                    f"job.{key} must be >= 0, got {getattr(self, key)}",
                    "use 0 for the profile's default or a positive number",
                )
        if self.hang_requeues < 0:
            raise ConfigError(
                f"job.hang_requeues must be >= 0, got {self.hang_requeues}",
                "use 0 (a hang ends the job) or the number of requeues after hangs to allow, e.g. 1",
            )
        if self.launch not in LAUNCH_MODES:
            raise ConfigError(
                f"job.launch = {self.launch!r} is not a launch mode",
                'use "srun" (one task per GPU) or "torchrun" (one task per node, c10d rendezvous)',
            )
        if self.container_start not in ("exec", "run"):
            raise ConfigError(
                f"job.container_start = {self.container_start!r} is neither exec nor run",
                'use "run" for images whose runscript prepares the environment (LUMI AI Factory), '
                'else "exec"',
            )
        self._check_time_and_signal()
        self._check_sizes()
        if "/" in self.name or not self.name.strip():
            raise ConfigError(
                f"job.name = {self.name!r} is empty or contains '/'",
                'SLURM puts the name into file names (%x in job.output); use e.g. "gpt-small"',
            )
        if not self.command:
            raise ConfigError("job.command is empty", 'give what each rank runs, e.g. ["exatrain", "train"]')
        self._check_extra_sbatch()
        self._check_label()
        for key, _value in self.env:
            if not key.isidentifier():
                raise ConfigError(
                    f"job.env name {key!r} is not a valid variable name",
                    "use letters, digits and underscores, not starting with a digit",
                )
        self._check_no_control_chars()

    def _check_label(self) -> None:
        """job.label labels a Python script's lines (`exatrain run --label`); other commands cannot get it."""
        if self.label and not can_label(list(self.command), self.launch):
            raise ConfigError(
                f"job.label = true, but job.command {shlex.join(self.command)!r} is not a Python script "
                f"exatrain starts in {self.launch} mode, so nothing can begin its lines with the rank",
                'write job.command as ["python", "train.py", ...] or ["python", "-m", "pkg", ...], or set '
                "job.label = false (exatrain's own trainer prints from rank 0)",
            )

    def _check_time_and_signal(self) -> None:
        seconds = parse_slurm_time(str(self.time))
        if seconds is None:
            raise ConfigError(
                f"job.time = {self.time!r} is not a SLURM time limit",
                'write minutes (120), minutes:seconds ("90:00"), hours:minutes:seconds ("02:00:00"), '
                'days-hours ("1-12"), days-hours:minutes ("1-12:30") or days-hours:minutes:seconds',
            )
        if seconds == 0:
            raise ConfigError(
                f"job.time = {self.time!r} is not a time limit exatrain can use (SLURM reads 0 as "
                "'no limit', which no partition grants)",
                'give the limit, e.g. "02:00:00"',
            )
        if seconds < 60:
            raise ConfigError(
                f"job.time = {self.time!r} is shorter than a minute", "SLURM limits are whole minutes"
            )
        if seconds > _MAX_DAYS * 86400:
            raise ConfigError(
                f"job.time = {self.time!r} is more than {_MAX_DAYS} days",
                "no partition allows that; check the units (minutes, or D-HH:MM:SS)",
            )
        if not self.signal:
            return
        if not _SIGNAL.fullmatch(self.signal):
            raise ConfigError(
                f"job.signal = {self.signal!r} is not SIG@SECONDS",
                'write e.g. "USR2@120" (sent to every rank); empty = none',
            )
        if self.signal.startswith("B:"):
            raise ConfigError(
                f"job.signal = {self.signal!r} goes to the batch shell only, and nothing in exatrain's "
                "script forwards it to the ranks: they would never checkpoint",
                f"write {self.signal[2:]!r} (SLURM sends it to every rank of the job step)",
            )
        if self.signal_lead() >= seconds:
            raise ConfigError(
                f"job.signal = {self.signal!r} comes {self.signal_lead()} s before the end, at or before "
                f"the start of a {seconds} s job (job.time = {self.time!r})",
                "use a lead time well inside the time limit, e.g. USR2@120 for jobs of an hour or more",
            )

    def _check_sizes(self) -> None:
        for key, limit in _ABSURD.items():
            if getattr(self, key) > limit:
                raise ConfigError(
                    f"job.{key} = {getattr(self, key)} is beyond any real node or cluster (> {limit})",
                    f"check the value: job.{key} counts per node (nodes: the whole job)",
                )

    def _check_extra_sbatch(self) -> None:
        for flag in self.extra_sbatch:
            if not flag.startswith("--"):
                raise ConfigError(
                    f"job.extra_sbatch entry {flag!r} is not a long flag",
                    'write full flags such as "--exclusive" or "--constraint=a100"',
                )
            name = flag.split("=", 1)[0]
            if name == "--no-requeue":
                raise ConfigError(
                    f"job.extra_sbatch entry {flag!r} contradicts the --requeue exatrain writes: "
                    "SLURM would refuse the requeue after a pre-timeout checkpoint",
                    "remove it: the job requeues itself after the checkpoint it writes on a 'time is up' "
                    'signal; a run that should not checkpoint and requeue sets checkpoint.signals = ""',
                )
            if name in _GENERATED:
                raise ConfigError(
                    f"job.extra_sbatch entry {flag!r} duplicates the {name} line exatrain writes",
                    f"set it through {_GENERATED[name]} instead and remove it from job.extra_sbatch",
                )
            if name in _CONFLICTS:
                raise ConfigError(
                    f"job.extra_sbatch entry {flag!r} contradicts the {_CONFLICTS[name]} request "
                    "exatrain writes (SLURM takes only one of them)",
                    "use job.mem_per_gpu_gb, job.gpus_per_node, job.cpus_per_task and job.nodes instead",
                )

    def _check_no_control_chars(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            texts = (
                [value]
                if isinstance(value, str)
                else [
                    t
                    for v in (value if isinstance(value, tuple) else ())
                    for t in (v if isinstance(v, tuple) else (v,))
                ]
            )
            for text in texts:
                if isinstance(text, str) and _FORBIDDEN.search(text):
                    raise ConfigError(
                        f"job.{f.name} contains a control character (newline, tab, ...): {text!r}",
                        "remove it: a newline would end the #SBATCH line and start a new script line",
                    )


def check_signal_handled(spec: JobSpec, handled: str) -> None:
    """The trainer must treat job.signal as 'time is up' (checkpoint.signals), or the signal kills every rank:
    SLURM's default action for USR1/USR2 is to terminate, so the job would end without a checkpoint."""
    if not spec.signal:
        return
    name = _signal_name(spec.signal.removeprefix("B:").split("@")[0])
    names = {_signal_name(n) for n in handled.split(",") if n.strip()}
    if name not in names:
        raise ConfigError(
            f"job.signal = {spec.signal!r} is not among checkpoint.signals = {handled!r}: "
            f"SIG{name} would kill the ranks before they checkpoint",
            f'add {name} to checkpoint.signals (e.g. "{",".join(sorted(names | {name}))}") or send one '
            "of those signals with job.signal",
        )


def _signal_name(text: str) -> str:
    return text.strip().upper().removeprefix("SIG")
