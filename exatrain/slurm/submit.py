"""From a configuration to a SLURM job: the script and config files, sbatch, --test-only, status, cancel.

SLURM is reached only through an injected :class:`~exatrain.slurm.runner.Runner`. Never imports torch.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from exatrain.config import Config, to_toml
from exatrain.config.validate import check_hang_timeout
from exatrain.errors import ExatrainError
from exatrain.slurm.containers import rank_paths
from exatrain.slurm.profiles import is_profile_path, load_profile
from exatrain.slurm.rank_command import command_kind
from exatrain.slurm.sbatch import render_sbatch
from exatrain.slurm.spec import JobSpec, check_signal_handled
from exatrain.slurm.sweep import Sweep

if TYPE_CHECKING:  # the runner module (subprocess) is loaded only where SLURM is really called
    from exatrain.slurm.runner import Runner

# sbatch's rejection reasons (Slurm 22.05+) -> what to change
_REJECTIONS = {
    "Requested node configuration is not available": "ask for at most as many nodes, GPUs, cores and "
    "memory per "
    "node as the partition has (see `sinfo -p PARTITION -o '%D %c %m %G'`); job.nodes, job.gpus_per_node, "
    "job.cpus_per_task and job.mem_per_gpu_gb set them",
    "Node count specification invalid": "job.nodes exceeds the nodes of the partition (sinfo -p PARTITION)",
    # what a site with EnforcePartLimits=ALL answers for more nodes or cores than the partition has
    "More processors requested than permitted": "ask for at most the partition's nodes and cores (sinfo -p "
    "PARTITION -o '%D %c'); job.nodes, job.gpus_per_node and job.cpus_per_task set them",
    "Invalid account": "set job.account to a project you belong to that may use job.partition (sacctmgr show "
    "assoc user=$USER; scontrol show partition PARTITION: AllowAccounts)",
    "invalid partition": "set job.partition to a partition of this cluster (sinfo -s)",
    "Invalid qos": "set job.qos to one your account may use in job.partition, or leave it empty "
    "(sacctmgr show assoc user=$USER format=account,partition,qos; scontrol show partition PARTITION: "
    "AllowQos)",
    "Requested time limit is invalid": "lower job.time to the partition's MaxTime (sinfo -o '%P %l')",
}


@dataclass(frozen=True)
class Prepared:
    """A job ready to submit: its script, the config its ranks read, and where both go."""

    spec: JobSpec
    run_dir: Path
    script: str
    config_text: str
    sweep: Sweep | None
    binds: tuple[str, ...] = ()  # a container job: the paths of the ranks it binds (launch.containers)

    @property
    def script_path(self) -> Path:
        return _beside_run_dir(self.run_dir, ".sbatch")

    @property
    def config_path(self) -> Path:
        return _beside_run_dir(self.run_dir, ".toml")

    def output_paths(self, job_id: str) -> tuple[str, str]:
        """stdout and stderr files of the job with %x/%j/%A filled in (arrays keep %a and %j: one per
        task)."""
        out = _fill(self.spec.output, self.spec.name, job_id, bool(self.sweep))
        err = _fill(self.spec.error, self.spec.name, job_id, bool(self.sweep)) if self.spec.error else out
        return out, err


def prepare(cfg: Config, sweep: Sweep | None = None) -> Prepared:
    """Check the ``[job]`` section against its profile and render the script; nothing is written.

    The script (which also writes the resolved config for the ranks, so it can be submitted by hand) and
    the config go next to the run directory (``runs/exp.sbatch`` and
    ``runs/exp.toml`` for run.dir = runs/exp), and so do relative output patterns. Paths the ranks need (run
    directory, a profile file) are made absolute; other relative paths (data) stay relative to the directory
    `submit` runs in, which is the job's working directory as with plain sbatch.
    """
    run_dir = Path(cfg.run.dir).resolve()
    job = dataclasses.replace(
        cfg.job, output=_beside(cfg.job.output, run_dir.parent), error=_beside(cfg.job.error, run_dir.parent)
    )
    if is_profile_path(job.profile):
        job = dataclasses.replace(job, profile=str(Path(job.profile).resolve()))
    cfg = dataclasses.replace(cfg, job=job, run=dataclasses.replace(cfg.run, dir=str(run_dir)))
    spec, profile = JobSpec.from_config(job), load_profile(job.profile)
    if command_kind(list(spec.command)) == "trainer":
        check_signal_handled(spec, cfg.checkpoint.signals)
    if cfg.run.hang_timeout_s > 0:
        check_hang_timeout(
            cfg.run.hang_timeout_s, "run.hang_timeout_s", spec.seconds(), f"job.time {job.time}"
        )
    text = to_toml(cfg)
    config_path = _beside_run_dir(run_dir, ".toml")
    binds = rank_paths(cfg, run_dir, Path.cwd()) if spec.container_image else ()
    return Prepared(
        spec,
        run_dir,
        render_sbatch(spec, profile, str(run_dir), (str(config_path), text), sweep, binds),
        text,
        sweep,
        binds,
    )


def _beside_run_dir(run_dir: Path, suffix: str) -> Path:
    """runs/exp.sbatch, runs/exp.toml for run.dir = runs/exp."""
    return run_dir.with_name(run_dir.name + suffix)


def _beside(pattern: str, directory: Path) -> str:
    return str(directory / pattern) if pattern and not Path(pattern).is_absolute() else pattern


def _fill(pattern: str, name: str, job_id: str, array: bool) -> str:
    values = {"x": name, "A": job_id} if array else {"x": name, "j": job_id, "A": job_id, "a": "0", "%": "%"}
    return re.sub(r"%([xjAa%])", lambda m: values.get(m.group(1), m.group(0)), pattern)


def submit(prepared: Prepared, runner: Runner) -> str:
    """Write the script and config next to the run directory and submit with sbatch; returns the job id."""
    prepared.script_path.parent.mkdir(parents=True, exist_ok=True)
    prepared.config_path.write_text(prepared.config_text)
    prepared.script_path.write_text(prepared.script)
    done = runner(["sbatch", "--parsable", str(prepared.script_path)])
    if done.returncode != 0:
        raise _rejection(done.stderr or done.stdout, "submit")
    job_id = done.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise ExatrainError(
            f"sbatch answered {done.stdout.strip()!r} instead of a job id",
            "check `sbatch --version` (exatrain needs --parsable, Slurm >= 14.03)",
        )
    return job_id


def check_schedulable(prepared: Prepared, runner: Runner) -> str:
    """Ask SLURM whether and when it would start the job (``sbatch --test-only``; nothing is queued).

    Returns SLURM's answer ("Job ... to start at ..."); a rejection raises ExatrainError with a HINT.
    """
    done = runner(["sbatch", "--test-only"], input=prepared.script)
    answer = (done.stderr + done.stdout).strip()
    if done.returncode != 0:
        raise _rejection(answer, "schedule")
    return answer.removeprefix("sbatch: ")


def _reason(text: str) -> str:
    """SLURM's first error line without the ``sbatch: error:`` prefix."""
    line = next(
        (line for line in text.splitlines() if "error" in line.lower()), text.strip() or "no reason given"
    )
    return re.sub(r"^\w+: error: ", "", line.strip())


def _rejection(text: str, verb: str) -> ExatrainError:
    reason = _reason(text)
    hint = next(
        (h for key, h in _REJECTIONS.items() if key.lower() in text.lower()),
        "read SLURM's reason above; `exatrain sbatch` prints the script with every flag",
    )
    return ExatrainError(f"SLURM would not {verb} the job: {reason}", hint)


def status(runner: Runner, job_id: str | None = None) -> str:
    """A table of the job (or of all your jobs): id, name, state, time used, nodes, reason or node list.

    Finished jobs that squeue no longer lists are looked up with scontrol (recent) and sacct (older).
    """
    fmt = "%.18i %.24j %.10T %.10M %.6D %R"
    args = ["squeue", "--noheader", f"--format={fmt}"] + (["--jobs", job_id] if job_id else ["--me"])
    done = runner(args)
    if done.returncode != 0 and not job_id:
        raise ExatrainError(
            f"squeue failed: {_reason(done.stderr or done.stdout)}",
            "check that the SLURM controller is reachable from here (SLURM_CONF, `scontrol ping`)",
        )
    rows = done.stdout.strip() if done.returncode == 0 else ""
    if rows or not job_id:
        header = f"{'JOBID':>18} {'NAME':>24} {'STATE':>10} {'TIME':>10} {'NODES':>6} NODELIST(REASON)"
        return header + ("\n" + rows if rows else "\n(no jobs)")
    return _finished(runner, job_id)


def _finished(runner: Runner, job_id: str) -> str:
    done = runner(["scontrol", "show", "job", "--oneliner", job_id])
    if done.returncode == 0 and done.stdout.strip():
        fields = [
            dict(kv.split("=", 1) for kv in line.split() if "=" in kv) for line in done.stdout.splitlines()
        ]
        return "\n".join(
            f"job {f.get('JobId')} ({f.get('JobName')}): {f.get('JobState')}, exit code "
            f"{f.get('ExitCode')}, ran {f.get('RunTime')} on {f.get('NodeList')}"
            for f in fields
            if f
        )
    done = runner(
        [
            "sacct",
            "--jobs",
            job_id,
            "--noheader",
            "--parsable2",
            "--format=JobID,JobName,State,ExitCode,Elapsed",
        ]
    )
    if done.returncode == 0 and done.stdout.strip():
        return "\n".join(line.replace("|", "  ") for line in done.stdout.splitlines())
    raise ExatrainError(
        f"SLURM knows no job {job_id}",
        "check the id (printed by `exatrain submit`); finished jobs are forgotten after MinJobAge "
        "unless accounting (sacct) is enabled",
    )


def cancel(runner: Runner, job_id: str) -> None:
    """Cancel a job (or one array task, ``123_4``) with scancel; SLURM's refusal raises ExatrainError."""
    if not re.fullmatch(r"\d+(_\d+)?", job_id):
        raise ExatrainError(
            f"{job_id!r} is not a SLURM job id", "pass the number printed by `exatrain submit`"
        )
    done = runner(["scancel", job_id])
    if done.returncode != 0:
        raise ExatrainError(
            f"scancel {job_id} failed: {_reason(done.stderr or done.stdout)}",
            "check the id with `exatrain status`; only your own jobs can be cancelled",
        )
