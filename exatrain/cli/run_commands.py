"""Train and run (`exatrain train`, `exatrain run`): the first group of `exatrain --help`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from exatrain.config import load_config


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
