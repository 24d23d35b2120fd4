"""`exatrain doctor`: is this allocation fit for a long job? One table per rank and node, a bandwidth sweep,
and a HINT per failed check (exit code 1). Run it where the job will run: `srun exatrain doctor`, or
locally with `--nproc N` (local gloo workers)."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from exatrain.distributed import all_gather_objects, init_distributed, teardown
from exatrain.config import JobConfig
from exatrain.distributed.affinity import check_affinity
from exatrain.observe import doctor


def doctor_here(env, args) -> int:
    """This rank's part of the doctor (a collective over all ranks); rank 0 prints; 1 when a check failed."""
    ctx = init_distributed(env, args.device, "auto", args.timeout)  # joining the group proves the master reachable
    try:
        check_affinity(ctx, JobConfig(profile=args.profile) if args.profile else JobConfig(), "warn")  # CPU affinity vs the profile's masks or the GPU's NUMA node
        caches = sorted({tempfile.gettempdir(), *(c for c in (args.cache_dir,) if c)})
        report = doctor.rank_report(ctx.rank, ctx.local_rank, ctx.env.local_world_size, ctx.device, caches)
        report["links"] = doctor.gpu_links() if ctx.local_rank == 0 else None
        reports = all_gather_objects(report)
        sweep = []
        if ctx.world_size > 1:
            sweep = doctor.bus_bandwidth_sweep(doctor.sweep_sizes(doctor.parse_size(args.max_size)), ctx.device,
                                               iters=args.iters)
        network = doctor.parse_nccl_network(Path(args.nccl_log).read_text()) if args.nccl_log else None
        problems = doctor.failures(reports, ctx.backend or "none", network)
        if ctx.rank == 0:
            _print(Console(width=max(120, Console().width)), reports, sweep, network, ctx.backend, problems)
        return 1 if problems else 0
    finally:
        teardown()


def _print(console: Console, reports, sweep, network, backend, problems) -> None:
    ranks = Table(title=f"exatrain doctor: {len(reports)} rank(s) on {len({r['host'] for r in reports})} node(s), "
                        f"backend {backend or 'none'}")
    for col in ("rank", "host", "local", "device", "GPUs seen", "ranks on node", "fabric", "net plugin", "caches writable"):
        ranks.add_column(col)
    for r in reports:
        caches = ", ".join(f"{c}: {'yes' if ok else 'NO'}" for c, ok in r["caches"].items())
        plugins = ", ".join(os.path.basename(p) for p in r["plugins"]) or "none"
        ranks.add_row(str(r["rank"]), r["host"], str(r["local_rank"]), r["device"], str(r["visible_gpus"]),
                      str(r["ranks_on_node"]), ", ".join(r["interfaces"]) or "none", plugins, caches)
    console.print(ranks)
    for r in reports:
        if r["links"]:
            console.print(f"GPU links on {r['host']}:\n{r['links']}")
    if network:
        console.print(f"NCCL network (from the NCCL_DEBUG=INFO log): {network}")
    if sweep:
        bw = Table(title="all_reduce sweep (float32 sum; busbw = algbw x 2(n-1)/n, as nccl-tests)")
        for col in ("size", "time", "algbw GB/s", "busbw GB/s"):
            bw.add_column(col, justify="right")
        for s in sweep:
            bw.add_row(_size(s["bytes"]), f"{s['time_s'] * 1e6:,.0f} us", _gbs(s['algbw_gbs']), _gbs(s['busbw_gbs']))
        console.print(bw)
    for problem, hint in problems:
        console.print(f"FAIL: {problem}\nHINT: {hint}", markup=False, highlight=False)
    console.print("doctor: all checks passed" if not problems else f"doctor: {len(problems)} check(s) failed")


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
