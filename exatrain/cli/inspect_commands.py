"""Inspect and plan (`exatrain env`, `config`, `plan`, `doctor`, `scale`, `report`, `dump`): the third group
of `exatrain --help`."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

from exatrain.config import load_config, reference, to_toml
from exatrain.errors import ConfigError, ExatrainError


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
        # an explicit --gpu-memory-gb wins (the site's GPUs differ from the profile's, e.g. an H200 node on a
        # generic profile)
        gpu_gb, per_node = args.gpu_memory_gb or profile.gpu_memory_gb or None, profile.gpus_per_node
        if per_node and args.world_size > per_node and args.world_size % per_node:
            raise ConfigError(
                f"--world-size {args.world_size} does not fill whole nodes of site {args.site!r} "
                f"(gpus_per_node = {per_node})",
                f"use a multiple of {per_node} ranks, or a profile whose gpus_per_node fits the job",
            )
        if args.time:
            hardware = check_hardware(profile.hardware, args.site, args.world_size, per_node)
    if args.search:
        return _search(cfg, args, hardware, per_node, gpu_gb, profile)
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

    target = _target(cfg, plan.vocab_size, tokens, plan.time, plan.world_size, profile)
    return dataclasses.replace(plan, target=target.to_dict())


def _search_with_target(result, cfg, tokens: int, vocab: int, profile):
    """The search's layouts with wall time and billing units to `tokens` tokens, and the fastest one's
    whole target (its sentence for a resource application): every layout trains on the same global batch,
    so the wall times rank as the step times do."""
    import dataclasses

    def with_target(lay):
        predicted = {"step_time_s": lay.step_time_s, "published_ratio": lay.published_ratio}
        t = _target(cfg, vocab, tokens, predicted, result.world_size, profile)
        return dataclasses.replace(lay, wall_time_h=t.wall_time_h, units=t.units), t

    layouts, targets = zip(*(with_target(lay) for lay in result.layouts), strict=True)
    result = dataclasses.replace(result, layouts=list(layouts), target=targets[0].to_dict())
    if result.fastest_validated is None:
        return result
    validated, t = with_target(result.fastest_validated)
    return dataclasses.replace(result, fastest_validated=validated, fastest_validated_target=t.to_dict())


def _target(cfg, vocab: int, tokens: int, predicted: dict, world_size: int, profile):
    """target.target_cost for one layout's prediction (`predicted`: its step_time_s and published_ratio),
    naming the configured model in the sentence's words."""
    from exatrain.models import configured_shape
    from exatrain.tools.plan.estimate import PublishedRatio
    from exatrain.tools.plan.planner import shape_params
    from exatrain.tools.plan.target import target_cost

    shape = configured_shape(cfg.model)
    what = (
        f"a {shape_params(cfg, vocab) / 1e6:,.4g}M-parameter transformer ({shape.n_layers} layers, "
        f"width {shape.dim}, sequence length {cfg.data.seq_len})"
    )
    tokens_per_step = cfg.train.global_batch_size * cfg.data.seq_len
    ratio = PublishedRatio(**predicted["published_ratio"])
    return target_cost(tokens, tokens_per_step, predicted["step_time_s"], world_size, profile, what, ratio)


def _search(cfg, args, hardware, per_node: int, gpu_gb, profile) -> int:
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
    vocab = args.vocab_size or default_vocab(cfg)[0]
    result = search(cfg, args.world_size, vocab, hardware, per_node, gpu_gb, args.top)
    if args.target_tokens is not None:
        result = _search_with_target(result, cfg, int(args.target_tokens), vocab, profile)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print_search(result)
    return 0


def cmd_doctor(args, overrides: list[str]) -> int:
    """Run the doctor here if a launcher started us; otherwise on --nproc local workers."""
    from exatrain.env import detect_environment
    from exatrain.launch import check_nproc, launch_local
    from exatrain.tools.doctor.settings import hang_settings, job_shape

    # the job's hang settings (flags, else its config, else the defaults): bad input fails here, at once
    args.hang = hang_settings(args.config, overrides, args.collective_timeout, args.hang_timeout)
    args.job_shape = job_shape(args.config, overrides)  # what the rate probes time (None: their defaults)
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


def _report(runs: list[str], out: Path) -> int:
    from exatrain.tools.report import check_plotting, write_report

    check_plotting()
    html_path, md_path, _ = write_report(runs, out)
    print(md_path.read_text(), end="")
    print(f"report: {html_path} (tables also in {md_path})")
    return 0


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
