"""What each subcommand does, on top of the library API."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from exatrain.config import load_config, reference, to_toml


def cmd_train(args, overrides: list[str]) -> int:
    """Train here if a launcher (torchrun, srun, mpirun) started us; otherwise start local workers."""
    from exatrain.launch import check_nproc, launch_local
    from exatrain.train.preflight import preflight

    from exatrain.env import detect_environment

    cfg = load_config(args.config, overrides)
    env = detect_environment(None, **cfg.dist.env_options())
    if env.kind != "local":
        if args.nproc not in (None, 1):
            print(f"exatrain: note: --nproc ignored: already launched by {env.kind} "
                  f"with {env.world_size} rank(s)", file=sys.stderr)
        return _train_here(cfg)
    for note in env.notes:
        print(f"exatrain: note: {note}", file=sys.stderr)
    nproc = check_nproc(args.nproc if args.nproc is not None else _default_nproc())
    preflight(cfg, nproc)
    if nproc == 1:
        return _train_here(cfg)
    from exatrain.train.run import prepare_data

    prepare_data(cfg)  # fails early on bad data, and fills the cache once instead of in every worker
    worker_args = ["train", *(["--config", str(Path(args.config).resolve())] if args.config else []), *overrides]
    return launch_local(nproc, "exatrain.cli.main", worker_args, max_restarts=args.max_restarts)


def _train_here(cfg) -> int:
    from exatrain.train.run import run_training

    summary = run_training(cfg)
    return summary.get("exit_code", 0)


def _default_nproc() -> int:
    from exatrain.env.devices import count_node_gpus

    return count_node_gpus() or 2


def cmd_env(args, overrides: list[str]) -> int:
    """Print the detected environment as a table or JSON."""
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


def cmd_plan(args, overrides: list[str]) -> int:
    """Validate the layout for --world-size ranks in this process and print memory per GPU."""
    from exatrain.train.plan import make_plan
    from exatrain.train.plan.report import print_plan, to_json

    cfg = load_config(args.config, overrides)
    gpu_gb = args.gpu_memory_gb
    if args.site:
        from exatrain.launch import load_profile

        gpu_gb = load_profile(args.site).gpu_memory_gb or None
    plan = make_plan(cfg, args.world_size, gpu_gb, args.vocab_size)
    if args.json:
        print(to_json(plan))
    else:
        print_plan(plan)
    return 0
