"""`exatrain doctor`: is this allocation fit for a long job? One table per rank and node, a bandwidth sweep,
and a HINT per failed check (exit code 1). Run it where the job will run: `srun exatrain doctor`, or
locally with `--nproc N` (local gloo workers)."""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from exatrain.config import JobConfig
from exatrain.distributed import all_gather_objects, init_distributed, teardown
from exatrain.distributed.affinity import check_affinity
from exatrain.distributed.nccl_debug import enable_nccl_debug_log, init_nccl_alone
from exatrain.env.watch import job_end_time
from exatrain.errors import ConfigError, ExatrainError
from exatrain.observe.hang import flight_recorder_works, pyspy_path
from exatrain.observe.heartbeat import AUTO_FLOOR_S
from exatrain.tools.doctor import probes as doctor
from exatrain.tools.doctor.settings import HangSettings

#: how long the hang watcher may take from detection to the dump and diagnosis (issue 25's bound)
HANG_DUMP_S = 30.0


def doctor_here(env, args) -> int:
    """This rank's part of the doctor (a collective over all ranks); rank 0 prints; 1 when a check failed.

    Started by `exatrain doctor --nproc N` (args.verdict_dir set), a rank exits 0 and leaves its verdict
    (0, 1, or 2 for an error it printed) in that folder instead: a worker's non-zero exit would make
    torchrun's agent report a crash under the doctor's table."""
    if not args.verdict_dir:
        return _doctor(env, args)
    try:
        code = _doctor(env, args)
    except ExatrainError as e:
        print(f"exatrain: error: {e}", file=sys.stderr, flush=True)
        code = 2
    Path(args.verdict_dir, f"rank{env.global_rank}").write_text(str(code))
    return 0


def _doctor(env, args) -> int:
    if args.nccl_log and not Path(args.nccl_log).is_file():
        raise ConfigError(
            f"--nccl-log {args.nccl_log}: no such file",
            "give the file an NCCL_DEBUG=INFO run wrote, "
            "or leave --nccl-log out (the doctor's GPU ranks log NCCL's set-up themselves)",
        )
    if not _may_use_nccl(args.device):
        return _checks(env, args, None)
    log_dir = Path(args.nccl_log_dir or tempfile.mkdtemp(prefix="exatrain-doctor-nccl-"))
    # NCCL reads its debug variables at its first communicator: set before the group exists
    nccl_log = enable_nccl_debug_log(log_dir, env.global_rank)
    try:
        return _checks(env, args, nccl_log)
    finally:
        if not args.nccl_log_dir:
            shutil.rmtree(log_dir, ignore_errors=True)


def _may_use_nccl(device: str) -> bool:
    return device != "cpu" and torch.cuda.is_available()


def _checks(env, args, nccl_log: Path | None) -> int:
    sizes = doctor.sweep_sizes(doctor.parse_size(args.max_size))  # bad input fails before the group is joined
    if args.iters < 1:
        raise ConfigError(
            f"--iters {args.iters}: the sweep needs at least one timed call per size", "use --iters 5"
        )
    ctx = init_distributed(
        env, args.device, "auto", args.timeout
    )  # joining the group proves the master reachable
    try:
        check_affinity(
            ctx, JobConfig(profile=args.site) if args.site else JobConfig(), "warn"
        )  # CPU affinity vs the profile's masks or the GPU's NUMA node
        caches = sorted({tempfile.gettempdir(), *(c for c in (args.cache_dir,) if c)})
        report = doctor.rank_report(ctx.rank, ctx.local_rank, ctx.env.local_world_size, ctx.device, caches)
        report["links"] = doctor.gpu_links() if ctx.local_rank == 0 else None
        sweep = []
        if ctx.world_size > 1:
            sweep = doctor.bus_bandwidth_sweep(sizes, ctx.device, iters=args.iters)
        elif ctx.device.type == "cuda":
            init_nccl_alone(ctx.device)  # one rank has no group: NCCL's set-up is still what it would use
        report["nccl"] = _nccl_report(nccl_log) if ctx.device.type == "cuda" else None
        report["flight_recorder"] = flight_recorder_works()
        shape = args.job_shape  # the job's model (cmd_doctor), None without its config
        report["matmul_tflops"], report["matmul_what"] = doctor.matmul_tflops(ctx.device, shape=shape)
        report["hbm_gbs"], report["hbm_what"] = doctor.memory_gbs(ctx.device, iters=args.iters)
        report["attention_tflops"], report["attention_what"] = doctor.attention_tflops(
            ctx.device,
            shape.seq_len if shape else 0,
            shape.head_dim if shape else 0,
            iters=args.iters,
            dropout=shape.dropout if shape else 0.0,
        )
        reports = all_gather_objects(report)
        network = doctor.parse_nccl_network(Path(args.nccl_log).read_text()) if args.nccl_log else None
        problems = doctor.failures(reports, ctx.backend or "none", network)
        if ctx.rank == 0:
            console = Console(width=max(120, Console().width))
            _print(console, reports, sweep, network, ctx.backend, problems, args.hang)
            profile = None
            if args.site:
                from exatrain.slurm import load_profile

                profile = load_profile(args.site)  # read once, for both
            _print_gpu_memory(reports, profile, args.site)
            _print_hardware(reports, sweep, profile)
        return 1 if problems else 0
    finally:
        teardown()


def _print_gpu_memory(reports, profile, site: str | None) -> None:
    """A WARNING when the --site profile's gpu_memory_gb is not the size of the GPUs here (before the
    [hardware] lines, which stay the last, to paste)."""
    warning = profile and doctor.gpu_memory_warning(reports, profile.gpu_memory_gb, site)
    if warning:
        print(warning, flush=True)


def _print_hardware(reports, sweep, profile) -> None:
    """The [hardware] lines measured here, for `exatrain plan --time` (docs/planning.md); the --site
    profile's data-sheet peak, if it has one."""
    hw = profile.hardware if profile else None
    peak = hw.peak_tflops if hw else 0.0
    print(
        "\n# [hardware] measured by exatrain doctor: paste into a copy of the site profile (replacing its "
        "[hardware] table) for exatrain plan --time; a run on one node gives the intra-node, a run on "
        "several nodes the inter-node bandwidth"
    )
    print("\n".join(doctor.hardware_lines(reports, sweep, peak)), flush=True)


def _nccl_report(nccl_log: Path | None) -> dict:
    """This rank's NCCL network and plugin, from the log its communicator's set-up wrote."""
    text = nccl_log.read_text(errors="replace") if nccl_log and nccl_log.exists() else ""
    return {**doctor.nccl_setup(text), "log": str(nccl_log) if nccl_log else None}


def _print(console: Console, reports, sweep, network, backend, problems, hang) -> None:
    ranks = Table(
        title=f"exatrain doctor: {len(reports)} rank(s) on {len({r['host'] for r in reports})} node(s), "
        f"backend {backend or 'none'}"
    )
    for col in (
        "rank",
        "host",
        "local",
        "device",
        "GPUs seen",
        "ranks on node",
        "fabric",
        "net plugin",
        "caches writable",
    ):
        ranks.add_column(col)
    for r in reports:
        caches = ", ".join(f"{c}: {'yes' if ok else 'NO'}" for c, ok in r["caches"].items())
        plugins = ", ".join(os.path.basename(p) for p in r["plugins"]) or "none"
        ranks.add_row(
            str(r["rank"]),
            r["host"],
            str(r["local_rank"]),
            r["device"],
            str(r["visible_gpus"]),
            str(r["ranks_on_node"]),
            ", ".join(r["interfaces"]) or "none",
            plugins,
            caches,
        )
    console.print(ranks)
    for r in reports:
        if r["links"]:
            console.print(f"GPU links on {r['host']}:\n{r['links']}")
    for line in _nccl_lines(reports):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if network:
        console.print(f"NCCL network (from the given NCCL_DEBUG=INFO log): {network}")
    if sweep:
        bw = Table(title="all_reduce sweep (float32 sum; busbw = algbw x 2(n-1)/n, as nccl-tests)")
        for col in ("size", "time", "algbw GB/s", "busbw GB/s"):
            bw.add_column(col, justify="right")
        for s in sweep:
            bw.add_row(
                _size(s["bytes"]), f"{s['time_s'] * 1e6:,.0f} us", _gbs(s["algbw_gbs"]), _gbs(s["busbw_gbs"])
            )
        console.print(bw)
    for problem, hint in problems:
        console.print(f"FAIL: {problem}\nHINT: {hint}", markup=False, highlight=False)
    console.print(_hang_line(reports, hang), markup=False, highlight=False, soft_wrap=True)
    console.print("doctor: all checks passed" if not problems else f"doctor: {len(problems)} check(s) failed")


def _hang_line(reports, hang: HangSettings) -> str:
    """The hang settings the job will run with (docs/hangs.md): the collective timeout, the hang watcher's
    timeout, what the dump can use, where each timeout came from (flag, config, default); a WARNING when
    the job's time left ends before either could fire."""
    hang_timeout, collective_s = hang.watcher.value, hang.collective.value
    fr = sum(1 for r in reports if r.get("flight_recorder"))
    spy = pyspy_path()
    if hang_timeout == "auto":
        watcher = (
            f"derived from the first steps (max(10 x the median step, {AUTO_FLOOR_S:g} s, the first step))"
        )
        earliest = AUTO_FLOOR_S
    elif hang_timeout:
        watcher, earliest = f"{hang_timeout:g} s", float(hang_timeout)
    else:
        watcher, earliest = "off", math.inf
    line = (
        f"hang settings: collective timeout {collective_s:g} s ([dist] timeout_s); hang watcher {watcher}; "
        f"torch's flight recorder answers on {fr} of {len(reports)} rank(s); py-spy "
        f"{spy or 'not installed (a stopped rank would be named without its stack line)'}\n"
        f"{hang.sources_line()}"
    )
    end, bound = job_end_time(), min(collective_s, earliest)
    if end is not None and end - time.time() < bound + HANG_DUMP_S:
        left = end - time.time()
        line += (
            f"\nWARNING: this job ends in {left:.0f} s, before a hang could be detected and dumped (after "
            f"{bound:g} s + up to {HANG_DUMP_S:g} s)\nHINT: set a hang timeout well below the time left: "
            f"`exatrain run --hang-timeout {max(2, int(left / 10))}` or --run.hang_timeout_s="
            f"{max(2, int(left / 10))} (doctor: --hang-timeout or -c FILE to check it)"
        )
    return line


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _gbs(value: float) -> str:
    """A bandwidth in GB/s with three significant digits and no exponent (small messages on a busy CPU
    reach well under 0.001 GB/s, which a fixed 3 decimals would print as 0.000)."""
    if value <= 0:
        return "0"
    return f"{value:.{max(2, 2 - math.floor(math.log10(value)))}f}"


def _nccl_lines(reports) -> list[str]:
    """One line per distinct NCCL set-up the GPU ranks' own logs showed, e.g. "NCCL network (each GPU rank's
    NCCL_DEBUG=INFO log): OFI, plugin aws-ofi-nccl 1.6.0, on rank(s) 0, 1"; none without NCCL ranks."""
    setups: dict[tuple, list[dict]] = {}
    for r in reports:
        if r.get("nccl") is not None:
            setups.setdefault((r["nccl"]["network"], r["nccl"]["plugin"]), []).append(r)
    lines = []
    for (network, plugin), ranks in setups.items():
        said = f"{network}, plugin {plugin}" if network and plugin else network or "not in the log"
        lines.append(
            f"NCCL network (each GPU rank's NCCL_DEBUG=INFO log): {said}, "
            f"on rank(s) {doctor.rank_list(ranks)}"
        )
    return lines
