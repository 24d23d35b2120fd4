"""What each subcommand does, on top of the library API."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from exatrain.config import load_config, reference, to_toml
from exatrain.errors import ConfigError, ExatrainError


def _check_torch(trainer: bool = False) -> None:
    """Stop at once, with a HINT, where this python's torch is missing or older than exatrain's floor (the
    trainer's, for ``trainer``), read from the package metadata: a rank on a site's old container says so in
    seconds, not with a traceback later."""
    from exatrain.env.torch_version import check_torch_floor, torch_version

    check_torch_floor(torch_version(), sys.executable, trainer)


def cmd_train(args, overrides: list[str]) -> int:
    """Train here if a launcher (torchrun, srun, mpirun) started us; otherwise start local workers."""
    _check_torch(trainer=True)
    from exatrain.env import detect_environment
    from exatrain.launch import check_nproc, launch_local
    from exatrain.train.preflight import preflight

    if args.affinity:
        overrides = [*overrides, f"--dist.affinity={args.affinity}"]
    cfg = load_config(args.config, overrides)
    env = detect_environment(None, **cfg.dist.env_options())
    if env.global_rank == 0:
        for note in env.notes:
            print(f"exatrain: note: {note}", file=sys.stderr)
    if env.kind != "local":
        if args.nproc not in (None, 1):
            print(
                f"exatrain: note: --nproc ignored: already launched by {env.kind} "
                f"with {env.world_size} rank(s)",
                file=sys.stderr,
            )
        return _train_here(cfg)
    nproc = check_nproc(args.nproc if args.nproc is not None else _default_nproc())
    preflight(cfg, nproc)
    if nproc == 1:
        return _train_here(cfg)
    from exatrain.train.data_setup import prepare_data

    prepare_data(cfg)  # fails early on bad data, and fills the cache once instead of in every worker
    worker_args = [
        "train",
        *(["--config", str(Path(args.config).resolve())] if args.config else []),
        *overrides,
    ]
    return launch_local(
        nproc,
        "exatrain.cli.main",
        worker_args,
        max_restarts=args.max_restarts,
        signals=cfg.checkpoint.signals,
        run_dir=cfg.run.dir,
    )


def _train_here(cfg) -> int:
    from exatrain.train.entry import run_training

    summary = run_training(cfg)
    return summary.get("exit_code", 0)


def _default_nproc() -> int:
    from exatrain.env.devices import count_node_gpus

    return count_node_gpus() or 2


def cmd_run(args, extra: list[str]) -> int:
    """Run the user's script: as this launcher's rank (exec), or in --nproc local workers under torchrun's
    agent."""
    _check_torch()
    from exatrain.env import detect_environment
    from exatrain.env.devices import count_node_gpus
    from exatrain.launch import peers
    from exatrain.launch import run as runner

    target = runner.check_target(_run_target(args.target))
    profile = _run_profile(args.site)
    suffix = (
        args.master_suffix if args.master_suffix is not None else (profile.master_suffix if profile else "")
    )
    env = detect_environment(
        None, master_suffix=suffix, resolve_master=args.resolve_master, master_port=args.master_port
    )
    tree = None if target.is_module else peers.parse_script(target.name)
    hang_env = _hang_variables(args)
    if env.kind == "local":
        return _run_local(args, env, target, tree, hang_env)
    if (args.nproc not in (None, 1) or args.max_restarts) and env.global_rank == 0:
        print(
            f"exatrain: note: --nproc and --max-restarts ignored: already launched by {env.kind} with "
            f"{env.world_size} rank(s)",
            file=sys.stderr,
        )
    child_env, notes = runner.rank_environment(
        env, os.environ, masks=profile.cpu_masks if profile else (), affinity=args.affinity
    )
    if env.global_rank == 0:
        notes += peers.peer_warnings(tree, os.environ, count_node_gpus(), launched=True)
    child_env.update(hang_env)
    for note in notes:
        print(f"exatrain: [rank {env.global_rank}] {note}", file=sys.stderr)
    runner.exec_rank(target, child_env, _runner_options(args))
    return 0  # not reached: exec replaced this process


def _hang_variables(args) -> dict[str, str]:
    """The workers' variables for --hang-timeout (validated here, before anything starts). Without it the
    ranks still record their pids and dump their stacks on SIGUSR1 and at a collective timeout (no watcher);
    `--hang-timeout 0` turns that off too."""
    if args.hang_timeout == 0:
        return {}
    import time

    from exatrain.config.validate import check_hang_timeout
    from exatrain.env.watch import hang_variables, job_end_time

    end = job_end_time()
    left = None if end is None else end - time.time()
    timeout = args.hang_timeout
    if timeout not in ("auto", None):
        timeout = check_hang_timeout(timeout, "--hang-timeout", left, "the time left of this SLURM job")
    return hang_variables(timeout, str(Path(args.run_dir).resolve()))


def _run_target(words: list[str] | None):
    from exatrain.launch.run import Target

    if not words:
        return None
    if words[0] == "-m":
        return Target(words[1] if len(words) > 1 else "", True, tuple(words[2:]))
    return Target(words[0], False, tuple(words[1:]))


def _run_profile(name: str | None):
    if not name:
        return None
    from exatrain.slurm import load_profile

    return load_profile(name)


def _run_local(args, env, target, tree, hang_env: dict[str, str]) -> int:
    from exatrain.env.devices import count_node_gpus
    from exatrain.launch import check_nproc, peers
    from exatrain.launch.local import check_max_restarts, cores_note, launch_target
    from exatrain.launch.run import batch_shell_error
    from exatrain.slurm.rank_command import SCRIPT_RUNNER

    problem = batch_shell_error(env)
    if problem and args.nproc is None:
        raise problem
    notes = list(env.notes)
    spawns = peers.spawn_line(tree)
    requested = args.nproc
    if spawns:  # one process, whose own children form the group (docs/peers.md)
        requested, note = peers.self_spawning_nproc(args.nproc, target.name, spawns)
        notes += [note] if note else []
    nproc = check_nproc(requested if requested is not None else _default_nproc())
    check_max_restarts(args.max_restarts)
    notes += [n for n in [cores_note(nproc)] if n]
    for note in notes:
        print(f"exatrain: note: {note}", file=sys.stderr)
    for warning in peers.peer_warnings(tree, os.environ, count_node_gpus(), launched=False):
        print(f"exatrain: {warning}", file=sys.stderr)
    return launch_target(
        nproc,
        ["-m", SCRIPT_RUNNER, *_runner_options(args), *target.words()],
        max_restarts=args.max_restarts,
        own_store=bool(spawns),
        extra_env=hang_env,
    )


def _runner_options(args) -> list[str]:
    """The script runner's own options from `exatrain run`'s: ``--label``."""
    from exatrain.slurm.rank_command import LABEL_OPTION

    return [LABEL_OPTION] if args.label else []


def cmd_env(args, overrides: list[str]) -> int:
    """Print the detected environment as a table or JSON."""
    import json

    from exatrain.env import detect_environment
    from exatrain.env.devices import describe_devices

    cfg = load_config(args.config, overrides)
    env = detect_environment(None, **cfg.dist.env_options())
    info = {**env.to_dict(), **describe_devices(env.local_rank, env.local_world_size)}
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="exatrain environment", show_header=True)
    table.add_column("what")
    table.add_column("value")
    for key, value in info.items():
        table.add_row(key, ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value))
    Console().print(table)
    return 0


def cmd_config(args, overrides: list[str]) -> int:
    """Print the resolved configuration as TOML, or the documented reference."""
    print(reference() if args.reference else to_toml(load_config(args.config, overrides)))
    return 0


def cmd_data(args, extra: list[str]) -> int:
    """`data prepare wikitext-2 --out DIR`: download on a machine with internet for offline training."""
    from exatrain.data.prepare import prepare_wikitext2

    out = prepare_wikitext2(args.out, url=args.url, timeout=args.timeout)
    print(f"WikiText-2 ready in {out}; train from it with --data.kind=wikitext --data.path={out}")
    return 0


def cmd_checkpoint(args, extra: list[str]) -> int:
    """`checkpoint export CKPT FILE`: the model of a sharded checkpoint as one file."""
    from exatrain.checkpoint import export_model

    out = export_model(args.checkpoint, args.output)
    print(f"wrote {out}; load it with torch.load(path, weights_only=True) or --checkpoint.init_from={out}")
    return 0


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
        f"{cost.units:g} {cost.unit} on {cost.partition} (rule {cost.rule}, for the whole time limit; "
        f"sites charge the time used)"
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


def cmd_doctor(args, overrides: list[str]) -> int:
    """Run the doctor here if a launcher started us; otherwise on --nproc local workers."""
    from exatrain.env import detect_environment
    from exatrain.launch import check_nproc, launch_local
    from exatrain.tools.doctor.settings import hang_settings

    # the job's hang settings (flags, else its config, else the defaults): bad input fails here, at once
    args.hang = hang_settings(args.config, overrides, args.collective_timeout, args.hang_timeout)
    env = detect_environment(None)
    nproc = check_nproc(args.nproc or 1)
    if env.kind != "local" or nproc == 1:
        from exatrain.tools.doctor.command import doctor_here

        return doctor_here(env, args)
    with tempfile.TemporaryDirectory(prefix="exatrain-doctor-") as verdicts:
        forwarded = [
            "doctor",
            f"--max-size={args.max_size}",
            f"--iters={args.iters}",
            f"--device={args.device}",
            f"--timeout={args.timeout}",
            f"--site={args.site}",
            f"--cache-dir={args.cache_dir}",
            *([f"--config={args.config}"] if args.config else []),
            *overrides,
            *([f"--hang-timeout={args.hang_timeout}"] if args.hang_timeout is not None else []),
            *(
                [f"--collective-timeout={args.collective_timeout}"]
                if args.collective_timeout is not None
                else []
            ),
            f"--nccl-log={args.nccl_log}",
            f"--nccl-log-dir={args.nccl_log_dir}",
            f"--verdict-dir={verdicts}",
        ]
        return _doctor_verdict(verdicts, nproc, launch_local(nproc, "exatrain.cli.main", forwarded))


def _doctor_verdict(verdict_dir: str, nproc: int, agent_code: int) -> int:
    """The exit code of `exatrain doctor --nproc N`: the worst verdict its ranks left (0 passed, 1 a check
    failed, 2 an error); the agent's own code when a rank ended without one (it crashed; the agent said
    which)."""
    codes = [int(p.read_text()) for p in Path(verdict_dir).glob("rank*")]
    if len(codes) < nproc and agent_code:
        return agent_code
    return max(codes, default=agent_code)


def cmd_scale(args, overrides: list[str]) -> int:
    """Run the study (one training run per world size), then write its report."""
    from exatrain.tools.report import check_plotting
    from exatrain.tools.scale import parse_counts, run_slurm_study, run_study

    cfg = load_config(args.config, overrides)  # bad configuration fails before the first run
    check_plotting()  # so does a missing matplotlib
    out = Path(args.out)
    config = str(Path(args.config).resolve()) if args.config else None
    if args.nodes:
        from exatrain.slurm.runner import SlurmRunner

        run_slurm_study(
            parse_counts(",".join(args.nodes), "--nodes"),
            out,
            args.mode,
            cfg.train.global_batch_size,
            config,
            overrides,
            SlurmRunner(),
        )
    else:
        run_study(
            parse_counts(",".join(args.nproc)), out, args.mode, cfg.train.global_batch_size, config, overrides
        )
    return _report([str(out)], out / "report.html")


def cmd_report(args, extra: list[str]) -> int:
    """Write the HTML report and its Markdown tables."""
    return _report(args.runs, Path(args.out))


def cmd_dump(args, extra: list[str], runner=None) -> int:
    """Signal the ranks of a running job to dump their stacks; print the diagnosis (docs/hangs.md)."""
    from exatrain.launch.stack_dump import dump_run, signal_run

    if args.this_node:
        ranks = signal_run(args.run_dir)
        print(f"{socket.gethostname()}: asked rank(s) {','.join(map(str, ranks)) or 'none'}")
        return 0
    if args.run_dir.replace("_", "").isdigit() and not Path(args.run_dir).is_dir():  # a SLURM job id
        from exatrain.slurm.runner import SlurmRunner
        from exatrain.tools.dump import dump_job

        text, complete = dump_job(runner or SlurmRunner(), args.run_dir)
        print(text)
        return 0 if complete else 1
    text, complete = dump_run(args.run_dir)
    if not text:
        raise ExatrainError(
            f"{args.run_dir}: no ranks recorded in its hang/ folder",
            "start the job with `exatrain run --run-dir DIR ...` (not --hang-timeout 0), then "
            "`exatrain dump DIR` on a node it runs on",
        )
    print(text)
    return 0 if complete else 1


def _report(runs: list[str], out: Path) -> int:
    from exatrain.tools.report import check_plotting, write_report

    check_plotting()
    html_path, md_path, _ = write_report(runs, out)
    print(md_path.read_text(), end="")
    print(f"report: {html_path} (tables also in {md_path})")
    return 0


def cmd_monitor(args, extra: list[str], runner=None) -> int:
    """Show a running job's GPUs (one table, or live until Ctrl-C)."""
    from exatrain.slurm.runner import SlurmRunner
    from exatrain.tools.monitor import monitor

    monitor(runner or SlurmRunner(), args.job_id, args.interval, args.once)
    return 0


def cmd_plan(args, overrides: list[str]) -> int:
    """Validate the layout for --world-size ranks in this process and print memory per GPU."""
    from exatrain.tools.plan import make_plan
    from exatrain.tools.plan.render import print_plan, to_json

    cfg = load_config(args.config, overrides)
    gpu_gb, hardware, per_node, profile = args.gpu_memory_gb, None, 0, None
    args.time = args.time or args.target_tokens is not None or args.search
    if args.time and not args.site:
        raise ConfigError(
            "--time needs the hardware constants of a site profile",
            "pass --site NAME|FILE whose [hardware] table sets matmul_tflops, intra_node_busbw_gbs "
            "and inter_node_busbw_gbs",
        )
    if args.site:
        from exatrain.slurm import load_profile
        from exatrain.tools.plan.estimate import check_hardware

        profile = load_profile(args.site)
        gpu_gb, per_node = profile.gpu_memory_gb or None, profile.gpus_per_node
        if per_node and args.world_size > per_node and args.world_size % per_node:
            raise ConfigError(
                f"--world-size {args.world_size} does not fill whole nodes of site {args.site!r} "
                f"(gpus_per_node = {per_node})",
                f"use a multiple of {per_node} ranks, or a profile whose gpus_per_node fits the job",
            )
        if args.time:
            hardware = check_hardware(profile.hardware, args.site)
    if args.search:
        return _search(cfg, args, hardware, per_node, gpu_gb)
    plan = make_plan(
        cfg, args.world_size, gpu_gb, args.vocab_size, hardware=hardware, gpus_per_node=per_node, comm=True
    )
    if args.target_tokens is not None:
        plan = _with_target(plan, cfg, int(args.target_tokens), profile)
    if args.json:
        print(to_json(plan))
    else:
        print_plan(plan)
    return 0


def _with_target(plan, cfg, tokens: int, profile):
    """The plan with wall time and billing units to `tokens` tokens (exatrain.tools.plan.target)."""
    import dataclasses

    from exatrain.models import configured_shape
    from exatrain.tools.plan.planner import shape_params
    from exatrain.tools.plan.target import target_cost

    shape = configured_shape(cfg.model)
    what = (
        f"a {shape_params(cfg, plan.vocab_size) / 1e6:,.4g}M-parameter transformer ({shape.n_layers} layers, "
        f"width {shape.dim}, sequence length {plan.seq_len})"
    )
    tokens_per_step = cfg.train.global_batch_size * plan.seq_len
    target = target_cost(tokens, tokens_per_step, plan.time["step_time_s"], plan.world_size, profile, what)
    return dataclasses.replace(plan, target=target.to_dict())


def _search(cfg, args, hardware, per_node: int, gpu_gb) -> int:
    """`exatrain plan --search`: the fastest valid layouts that fit (exatrain.tools.plan.search)."""
    import json

    from exatrain.tools.plan.planner import MAX_WORLD_SIZE, default_vocab
    from exatrain.tools.plan.render import print_search
    from exatrain.tools.plan.search import search

    if not 1 <= args.world_size <= MAX_WORLD_SIZE:
        raise ConfigError(
            f"--world-size must be from 1 to {MAX_WORLD_SIZE}, got {args.world_size}",
            "pass the number of ranks (GPUs) of the job, e.g. --world-size 1024",
        )
    if args.top < 1:
        raise ConfigError(f"--top must be at least 1, got {args.top}", "pass e.g. --top 5")
    if args.target_tokens is not None:
        raise ConfigError(
            "--target-tokens works on one layout, not with --search",
            "run --search first, then plan the chosen layout (its printed options) with --target-tokens",
        )
    vocab = args.vocab_size or default_vocab(cfg)[0]
    result = search(cfg, args.world_size, vocab, hardware, per_node, gpu_gb, args.top)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print_search(result)
    return 0
