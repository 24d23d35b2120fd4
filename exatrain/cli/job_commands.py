"""Jobs on a SLURM cluster (`exatrain submit`, `sbatch`, `cost`, `status`, `cancel`, `monitor`, `container`):
the second group of `exatrain --help`."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from exatrain.config import load_config
from exatrain.errors import ExatrainError


def _prepared(args, overrides: list[str]):
    from exatrain.slurm.submit import prepare
    from exatrain.slurm.sweep import parse_sweep

    return prepare(load_config(args.config, overrides), parse_sweep(args.array or []))


def cmd_sbatch(args, overrides: list[str]) -> int:
    """`exatrain sbatch` is `exatrain submit --dry-run`: the job script on stdout, the sbatch command on
    stderr."""
    args.dry_run, args.test_only = True, False
    return cmd_submit(args, overrides)


def cmd_cost(args, overrides: list[str]) -> int:
    """Print the billing estimate of the [job] section and advice for wasteful requests."""
    from exatrain.slurm import JobSpec, estimate_cost, load_profile

    job = load_config(args.config, overrides).job
    cost = estimate_cost(JobSpec.from_config(job), load_profile(job.profile))
    print(
        f"{cost.units:g} {cost.unit} on {cost.partition or 'the default partition'} (rule {cost.rule}, "
        "for the whole time limit; sites charge the time used)"
    )
    print(f"  {cost.explanation}")
    for advice in cost.advice:
        print(f"ADVICE: {advice}")
    return 0


def cmd_submit(args, overrides: list[str], runner=None) -> int:
    """Submit (or --dry-run / --test-only) the job; prints job id, script, run dir and output files."""
    from exatrain.slurm.runner import SlurmRunner
    from exatrain.slurm.submit import check_schedulable, submit

    job = _prepared(args, overrides)
    runner = runner or SlurmRunner()
    _check_container(job, dry_run=args.dry_run or args.test_only)
    if args.dry_run:
        print(job.script, end="")
        print(
            f"# dry run: would write {shlex.quote(str(job.script_path))} and "
            f"{shlex.quote(str(job.config_path))}, "
            f"then run: {shlex.join(['sbatch', '--parsable', str(job.script_path)])}",
            file=sys.stderr,
        )
        folder = Path(job.output_paths("0")[0]).parent
        if not folder.is_dir():
            print(
                f"exatrain: note: SLURM does not create the output directory {folder}: create it before "
                "submitting this script by hand, or use `exatrain submit`",
                file=sys.stderr,
            )
        return 0
    if args.test_only:
        print(f"SLURM would accept it: {check_schedulable(job, runner)}")
        return 0
    job_id = submit(job, runner)
    out, err = job.output_paths(job_id)
    tasks = (
        (
            f" ({job.sweep.size} array tasks, run dirs {job.run_dir}/array-N; in output files %a = task "
            "index, %j = task job id)"
        )
        if job.sweep
        else ""
    )
    print(
        f"submitted job {job_id}{tasks}\n  script  {job.script_path}\n  config  {job.config_path}\n"
        f"  run dir {job.run_dir}\n  stdout  {out}\n  stderr  {err}\n"
        f"follow it with: exatrain status {job_id}"
    )
    return 0


def cmd_container(args, extra: list[str]) -> int:
    """`container venv IMAGE VENV [PACKAGES]`: create the job's venv through the image, then check it."""
    from exatrain.slurm.container_env import check_image, source_spec, venv_command
    from exatrain.slurm.containers import both_names

    venv = str(Path(args.venv).absolute())
    if Path(venv).exists():
        raise ExatrainError(f"{venv} already exists", "remove it first (rm -r), or pick another path")
    source = [source_spec()] if source_spec().startswith("/") else []  # a checkout: pip reads it inside
    binds = tuple(dict.fromkeys([*args.bind, *map(str, sorted(both_names(Path(venv).parent))), *source]))
    argv = venv_command(args.runtime, args.image, venv, args.start, binds, tuple(args.packages))
    print(f"creating {venv} through {args.image}: {shlex.join(argv[:-1])} SCRIPT", file=sys.stderr)
    done = subprocess.run(argv, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        import shutil

        shutil.rmtree(venv, ignore_errors=True)  # half a venv would pass the existence checks
        raise ExatrainError(
            f"creating the venv {venv} through {args.image} failed (exit {done.returncode})",
            "read the output above; the image needs python with venv and pip",
        )
    torch_version, version = check_image(args.runtime, args.image, args.start, venv, binds)
    print(
        f"ready: {venv} (exatrain {version}, torch {torch_version} of the image); set job.container_venv = "
        f'"{venv}" and job.container_start = "{args.start}"'
    )
    return 0


def _check_container(job, dry_run: bool) -> None:
    """A container job: its bind paths exist and the image's environment imports torch and exatrain (through
    the runtime, seconds), before anything is submitted. A dry run without the runtime only says so."""
    import shutil

    from exatrain.slurm.container_check import check_job

    spec = job.spec
    if not spec.container_image:
        return
    runtime = check_job(job, run_image=not dry_run or shutil.which(_runtime(spec)) is not None)
    if runtime:
        print(runtime, file=sys.stderr)


def _runtime(spec) -> str:
    from exatrain.slurm import load_profile

    return load_profile(spec.profile).container_runtime


def cmd_status(args, extra: list[str], runner=None) -> int:
    """Print a job's (or all your jobs') state."""
    from exatrain.slurm.runner import SlurmRunner
    from exatrain.slurm.submit import status

    print(status(runner or SlurmRunner(), args.job_id))
    return 0


def cmd_cancel(args, extra: list[str], runner=None) -> int:
    """Cancel a job."""
    from exatrain.slurm.runner import SlurmRunner
    from exatrain.slurm.submit import cancel

    cancel(runner or SlurmRunner(), args.job_id)
    print(f"cancelled job {args.job_id}")
    return 0


def cmd_monitor(args, extra: list[str], runner=None) -> int:
    """Show a running job's GPUs (one table, or live until Ctrl-C)."""
    from exatrain.slurm.runner import SlurmRunner
    from exatrain.tools.monitor import monitor

    monitor(runner or SlurmRunner(), args.job_id, args.interval, args.once)
    return 0
