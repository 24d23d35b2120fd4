"""`exatrain doctor`: checks of one rank's node before a long job, and an all-reduce bandwidth sweep.

The pieces here are per rank (what this process sees) or collective over an already running process group
(the sweep); the command in exatrain/cli starts the group, gathers every rank's report and prints them.
Bus bandwidth is computed as nccl-tests does for all_reduce: algbw = bytes / time, busbw = algbw x 2(n-1)/n.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from exatrain.errors import ConfigError

HIGH_SPEED_PREFIXES = ("hsn", "ib")  # Slingshot (LUMI), InfiniBand (JSC)
PLUGIN_PATTERNS = ("libnccl-net*.so*", "librccl-net*.so*")
KIB = 1024
DEFAULT_SIZES = tuple(KIB * 4**i for i in range(10))  # 1 KiB .. 256 MiB


def parse_size(text: str) -> int:
    """Bytes of a size like 256MiB, 64KiB, 1GiB or 4096."""
    m = re.fullmatch(r"\s*(\d+)\s*(|B|KiB|MiB|GiB|K|M|G)\s*", text)
    if not m:
        raise ConfigError(
            f"size {text!r}: expected a number of bytes with an optional unit B, KiB, MiB or GiB",
            "use e.g. --max-size 64KiB or --max-size 256MiB",
        )
    unit = {"": 1, "B": 1, "K": KIB, "KiB": KIB, "M": KIB**2, "MiB": KIB**2, "G": KIB**3, "GiB": KIB**3}[
        m.group(2)
    ]
    return int(m.group(1)) * unit


def sweep_sizes(max_bytes: int) -> list[int]:
    """The message sizes of the sweep up to `max_bytes`: 1 KiB, 4 KiB, ... (powers of 4)."""
    return [s for s in DEFAULT_SIZES if s <= max_bytes] or [KIB]


def bus_bandwidth_sweep(
    sizes: list[int], device: torch.device, iters: int = 5, warmup: int = 1
) -> list[dict]:
    """all_reduce (sum, float32) of each size over all ranks; the time per call is the slowest rank's mean.

    Returns [{"bytes", "time_s", "algbw_gbs", "busbw_gbs"}]; a collective: every rank calls it."""
    n = dist.get_world_size()
    results = []
    for size in sizes:
        buf = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        for _ in range(warmup):
            dist.all_reduce(buf)
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        _sync(device)
        elapsed = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        t = elapsed.item()
        algbw = buf.numel() * 4 / t / 1e9
        results.append(
            {
                "bytes": buf.numel() * 4,
                "time_s": t,
                "algbw_gbs": algbw,
                "busbw_gbs": all_reduce_bus_bandwidth(algbw, n),
            }
        )
    return results


def all_reduce_bus_bandwidth(algbw: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth of an all_reduce: algbw x 2(n-1)/n, the rate each link carries in a ring
    (comparable with the hardware's peak whatever the number of ranks)."""
    return algbw * 2 * (ranks - 1) / ranks


#: each rate probe runs for at least this long (whole batches of `iters` calls): a few calls of a millisecond,
#: on a shared CPU or a GPU changing its clocks, measure the moment rather than the machine
MIN_TIMED_S = 0.25


def calls_per_s(call, device: torch.device, iters: int, min_s: float = MIN_TIMED_S) -> float:
    """Calls per second of `call` on `device`: one warm-up call (kernel selection, allocation), a barrier
    when a group exists (every rank starts at once and shares the node as training does), then batches of
    `iters` calls until `min_s` seconds have passed."""
    call()
    _sync(device)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    calls, t0 = 0, time.perf_counter()
    while True:
        for _ in range(iters):
            call()
        _sync(device)
        calls += iters
        elapsed = time.perf_counter() - t0
        if elapsed >= min_s:
            return calls / elapsed


#: the job's products are timed at most at this many tokens (rows), CPU / GPU: beyond it the rate no longer
#: grows, while the time (a large model's block on a CPU) and the head's memory (tokens x vocabulary) do
MAX_PRODUCT_ROWS = {False: 2**11, True: 2**15}


def matmul_tflops(device: torch.device, size: int = 0, iters: int = 5, shape=None) -> tuple[float, str]:
    """TFLOP/s of matrix products on `device`, and what ran (`matmul_tflops` of a profile's [hardware]).

    Without the job's `shape`: square products, bf16 8192^3 on a GPU, fp32 512^3 on a CPU (where bf16
    products are not the training path). With it (settings.JobShape, from the job's config): the job's own
    products, as the step runs them: one block's linear layers (wq, wk, wv, wo: dim x dim; w1, w2: dim x
    hidden) and the output head (dim x vocabulary) at the rank's tokens per micro-batch (at most
    MAX_PRODUCT_ROWS), each forward
    (x W^T) and both backward products (dY W, dY^T x), the block weighted n_layers times. A small model's
    products run far below the square's rate, and that is the rate its step has; a product that does not
    fit in memory falls back to the squares."""
    gpu = device.type == "cuda"
    dtype, kind = _training_dtype(device)
    if shape is not None:
        rows = min(shape.tokens, MAX_PRODUCT_ROWS[gpu])
        of_job = "" if rows == shape.tokens else f" (of the job's {shape.tokens})"
        try:
            # one call per timed batch: a large model's call on a CPU takes seconds (0.25 s of them is plenty)
            return _job_products_tflops(device, dtype, shape, rows, 1), (
                f"{kind} products of the job's linear layers at {rows} tokens{of_job} (dim {shape.dim}, "
                f"hidden {shape.hidden}, vocabulary {shape.vocab}), forward and backward, {shape.n_layers} "
                "blocks + head"
            )
        except (RuntimeError, MemoryError) as e:  # torch's out-of-memory errors are RuntimeErrors
            fallback = f" (the job's products did not fit: {str(e).splitlines()[0][:80]})"
    else:
        fallback = ""
    n = size or (8192 if gpu else 512)
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    rate = calls_per_s(lambda: a @ b, device, iters)
    return 2 * n**3 * rate / 1e12, f"{kind} {n}x{n} products{fallback}"


def _training_dtype(device: torch.device) -> tuple[torch.dtype, str]:
    """The dtype products run in training, and its name: bf16 on a GPU, fp32 on a CPU (where bf16 products
    are not the training path)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return dtype, str(dtype).removeprefix("torch.")


def _job_products_tflops(device: torch.device, dtype: torch.dtype, shape, rows: int, iters: int) -> float:
    """TFLOP/s over the step's linear products at `rows` tokens: (n_layers x block FLOPs + head FLOPs) /
    (n_layers x block time + head time), each timed by calls_per_s."""
    d, h = shape.dim, shape.hidden
    block_s, block_flops = _linear_products([(d, d)] * 4 + [(d, h), (h, d)], rows, dtype, device, iters)
    head_s, head_flops = _linear_products([(d, shape.vocab)], rows, dtype, device, iters)
    n = shape.n_layers
    return (n * block_flops + head_flops) / (n * block_s + head_s) / 1e12


def _linear_products(layers, tokens: int, dtype: torch.dtype, device: torch.device, iters: int):
    """(seconds, FLOPs) of one call running the forward and backward products of linear layers
    (in, out) at `tokens` rows: y = x W^T, dx = dy W, dW = dy^T x (as autograd computes them)."""
    tensors = [
        tuple(torch.randn(*s, dtype=dtype, device=device) for s in ((tokens, i), (o, i), (tokens, o)))
        for i, o in layers
    ]

    def call():
        for x, w, dy in tensors:
            x @ w.t()
            dy @ w
            dy.t() @ x

    return 1 / calls_per_s(call, device, iters), sum(3 * 2 * tokens * i * o for i, o in layers)


def attention_tflops(
    device: torch.device, seq_len: int = 0, head_dim: int = 0, iters: int = 5, dropout: float = 0.0
) -> tuple[float, str]:
    """TFLOP/s of torch's fused attention (F.scaled_dot_product_attention, causal, forward + backward) at one
    shape, counted as the step-time model counts attention: 12 B H T^2 d FLOPs, the full T x T products of
    the forward and the backward with no causal halving (`attention_tflops` of a profile's [hardware]
    table). The shape is the job's (sequence length, head dimension) when given, else 2048 x 128 on a GPU
    and 512 x 64 on a CPU; batch x heads fills 2^17 (GPU) or 2^13 (CPU) query rows. Attention runs below
    the best matrix product, the more so the smaller the head dimension, so it has a rate of its own. With
    the job's `dropout` the kernel drops out as in training: a GPU's fused kernel draws its mask inside, a
    CPU takes the math path (scores in memory), and the rate is what that costs."""
    import torch.nn.functional as F

    gpu = device.type == "cuda"
    t, d = seq_len or (2048 if gpu else 512), head_dim or (128 if gpu else 64)
    heads = max(1, (2**17 if gpu else 2**13) // t)
    dtype, kind = _training_dtype(device)
    q, k, v = (torch.randn(1, heads, t, d, dtype=dtype, device=device, requires_grad=True) for _ in range(3))
    grad = torch.randn(1, heads, t, d, dtype=dtype, device=device)

    def forward_backward():
        F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True).backward(grad)

    rate = calls_per_s(forward_backward, device, iters)
    what = f"{kind} causal attention, {heads} heads x {t} tokens x {d}, forward + backward"
    if dropout:
        what += f", dropout {dropout:g}"
    return 12 * heads * t**2 * d * rate / 1e12, what


def memory_gbs(device: torch.device, elements: int = 0, iters: int = 5) -> tuple[float, str]:
    """Memory bandwidth of this rank in GB/s, as STREAM's Add counts it: c = a + b over fp32 tensors larger
    than any cache (2^28 elements on a GPU, 2^24 on a CPU), bytes read + written (3 x 4 per element) over
    the time. Every rank runs it at once (calls_per_s), so ranks sharing a memory system each get their
    share, as they do in training. `hbm_gbs` of a profile's [hardware] table."""
    gpu = device.type == "cuda"
    n = elements or (2**28 if gpu else 2**24)
    a = torch.ones(n, dtype=torch.float32, device=device)
    b, c = torch.ones_like(a), torch.empty_like(a)
    rate = calls_per_s(lambda: torch.add(a, b, out=c), device, iters)  # warm-up: first touch of the pages
    mib = n * 4 // 2**20
    return 3 * 4 * n * rate / 1e9, f"fp32 c = a + b over {mib} MiB tensors (STREAM Add)"


def hardware_lines(reports: list[dict], sweep: list[dict], peak_tflops: float = 0.0) -> list[str]:
    """The [hardware] table measured here, to paste into a copy of the site profile (docs/planning.md):
    the slowest rank's matmul TF/s and memory bandwidth, and the busbw of the sweep's largest all_reduce as
    intra-node (all ranks on one node) or inter-node bandwidth (ranks on several nodes), with the whole sweep
    as that bandwidth's curve by message size."""
    slowest = min(reports, key=lambda r: r["matmul_tflops"])
    lines = [
        "[hardware]",
        'source = "measured"  # by exatrain doctor (peak_tflops, if below, is the data sheet\'s)',
    ]
    if peak_tflops:
        lines.append(f"peak_tflops = {peak_tflops:g}  # from the site profile (data sheet)")
    lines.append(
        f"matmul_tflops = {slowest['matmul_tflops']:.4g}  # measured: {slowest['matmul_what']}, "
        f"slowest of {len(reports)} rank(s)"
    )
    if all("attention_tflops" in r for r in reports):
        slow = min(reports, key=lambda r: r["attention_tflops"])
        lines.append(
            f"attention_tflops = {slow['attention_tflops']:.4g}  # measured: {slow['attention_what']}, "
            f"counted as 12 B H T^2 d, slowest of {len(reports)} rank(s)"
        )
    if all("hbm_gbs" in r for r in reports):
        slow = min(reports, key=lambda r: r["hbm_gbs"])
        lines.append(
            f"hbm_gbs = {slow['hbm_gbs']:.4g}  # measured: {slow['hbm_what']}, bytes read + written, "
            f"slowest of {len(reports)} rank(s) running at once"
        )
    if sweep:
        nodes = len({r["host"] for r in reports})
        key = "intra_node_busbw_gbs" if nodes == 1 else "inter_node_busbw_gbs"
        big = sweep[-1]
        lines.append(
            f"{key} = {big['busbw_gbs']:.4g}  # measured: all_reduce busbw of {big['bytes']} bytes over "
            f"{len(reports)} ranks on {nodes} node(s)"
        )
        if len(sweep) > 1:  # by size: the plan runs each collective at its own size's busbw
            points = ", ".join(f"[{s['bytes']}, {s['busbw_gbs']:.4g}]" for s in sweep)
            curve = key.replace("_gbs", "_curve")
            lines.append(f"{curve} = [{points}]  # measured: the same sweep, [bytes, busbw GB/s] by size")
        if nodes > 1 and any(r.get("visible_gpus", 0) > r.get("ranks_on_node", 0) for r in reports):
            # the step-time model reads the inter-node busbw as a group of whole nodes' and gives groups
            # with fewer ranks per node their share of it (estimate.node_links_share)
            lines.append(
                "# WARNING: fewer ranks than GPUs on a node: this busbw is not that of whole nodes, which "
                "`exatrain plan --time` assumes; HINT: rerun the doctor with one rank per GPU on every node"
            )
    return lines


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def high_speed_interfaces(sys_net: str = "/sys/class/net") -> list[str]:
    """Network interfaces of this node that are high-speed fabrics (hsn*, ib*)."""
    try:
        names = os.listdir(sys_net)
    except OSError:
        return []
    return sorted(n for n in names if n.startswith(HIGH_SPEED_PREFIXES))


def network_plugins(library_path: str | None = None) -> list[str]:
    """NCCL/RCCL network plugin libraries (aws-ofi-nccl / aws-ofi-rccl, IB plugins) on the library path."""
    path = os.environ.get("LD_LIBRARY_PATH", "") if library_path is None else library_path
    found = []
    for directory in filter(None, path.split(":")):
        for pattern in PLUGIN_PATTERNS:
            found += glob.glob(os.path.join(directory, pattern))
    return sorted(set(found))


# NCCL's name of the network it uses ("Using network X") -> the family the doctor reports
_NETWORK_FAMILY = {
    "Socket": "Socket",
    "IB": "IB",
    "IBext": "IB",
    "OFI": "OFI",
    "Libfabric": "OFI",
    "AWS Libfabric": "OFI",
}


def parse_nccl_network(log: str) -> str | None:
    """The network an NCCL_DEBUG=INFO log says NCCL uses: "Socket" (TCP), "IB" (NCCL's own InfiniBand/RoCE
    transport, or the HPC-X plugin's "IBext"), "OFI" (libfabric through aws-ofi-nccl / aws-ofi-rccl, e.g. on
    Slingshot), another plugin's own name, or None when the log does not say (no communicator set up yet)."""
    m = re.findall(r"NCCL INFO Using network (.+?)\s*$", log, re.M)
    if m:
        return _NETWORK_FAMILY.get(m[-1], m[-1])
    for tag in ("NET/OFI", "NET/IB", "NET/Socket"):
        if re.search(rf"NCCL INFO {tag} : Using", log) or (
            tag == "NET/OFI" and re.search("Selected [Pp]rovider", log)
        ):
            return tag.removeprefix("NET/")
    return None


def parse_nccl_plugin(log: str) -> str | None:
    """The network plugin an NCCL_DEBUG=INFO log says NCCL loaded ("aws-ofi-nccl 1.6.0", "NCCL RDMA Plugin
    v6", a library path), "internal" when it found none and uses its own IB/Socket transports, None when the
    log does not say."""
    patterns = (
        r"NET/OFI (?:Using|Initializing) (aws-ofi-[rn]ccl\S*(?: \S+)?)",  # aws-ofi-nccl / aws-ofi-rccl
        r"NET/Plugin ?: Loaded net plugin (.+?)(?: \(v\d+\))?\s*$",
        r"Plugin Path : (\S+)",
    )
    for pattern in patterns:
        m = re.search(pattern, log, re.M)
        if m:
            return m.group(1)
    if re.search(r"NET/Plugin ?: (?:.*No plugin found|Using internal network plugin)", log):
        return "internal"
    return None


def nccl_setup(log: str) -> dict:
    """{"network", "plugin"} of one rank's NCCL_DEBUG=INFO log (None where the log does not say)."""
    return {"network": parse_nccl_network(log), "plugin": parse_nccl_plugin(log)}


def writable(directory: str | Path) -> bool:
    """Whether this process can create a file in `directory` (which must exist)."""
    try:
        with tempfile.NamedTemporaryFile(dir=directory):
            return True
    except OSError:
        return False


def gpu_links() -> str | None:
    """The GPU-GPU link matrix of this node (`nvidia-smi topo -m` or `rocm-smi --showtopo`), if a tool has
    it."""
    for cmd in (["nvidia-smi", "topo", "-m"], ["rocm-smi", "--showtopo"]):
        if shutil.which(cmd[0]):
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            except (OSError, subprocess.SubprocessError):
                continue
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
    return None


def rank_report(
    rank: int, local_rank: int, local_world_size: int, device: torch.device, caches: list[str]
) -> dict:
    """What one rank sees: host, device, GPUs visible vs ranks on the node, fabrics, plugins, caches."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {
        "rank": rank,
        "host": socket.gethostname(),
        "local_rank": local_rank,
        "device": str(device),
        "visible_gpus": gpus,
        "ranks_on_node": local_world_size,
        "gpu_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "gpu_memory_gib": (
            torch.cuda.get_device_properties(device).total_memory / 2**30 if device.type == "cuda" else None
        ),
        "interfaces": high_speed_interfaces(),
        "plugins": network_plugins(),
        "caches": {c: writable(c) for c in caches if os.path.isdir(c)},
    }


def failures(reports: list[dict], backend: str, nccl_network: str | None = None) -> list[tuple[str, str]]:
    """(problem, HINT) for every failed check across all ranks' reports (each rank's own NCCL log in its
    "nccl" entry; `nccl_network` from a log the user recorded, `--nccl-log`)."""
    out = []
    for r in reports:
        where = f"rank {r['rank']} on {r['host']}"
        if r["device"].startswith("cuda") and r["visible_gpus"] < 1:
            out.append(
                (
                    f"{where}: device {r['device']} but no GPU visible",
                    "check --gpus-per-task / CUDA_VISIBLE_DEVICES",
                )
            )
        if r["device"].startswith("cuda") and r["visible_gpus"] not in (1, r["ranks_on_node"]):
            out.append(
                (
                    f"{where}: sees {r['visible_gpus']} GPU(s) with {r['ranks_on_node']} rank(s) on the node",
                    "bind one GPU per rank (--gpus-per-task=1) or all node GPUs to every rank "
                    "(--gpus-per-node)",
                )
            )
        for cache, ok in r["caches"].items():
            if not ok:
                out.append(
                    (
                        f"{where}: cache directory {cache} is not writable",
                        "point data.cache_dir / TMPDIR at a writable node-local directory",
                    )
                )
    nodes = {r["host"] for r in reports}
    if backend == "nccl" and len(nodes) > 1:
        on_socket = [r for r in reports if (r.get("nccl") or {}).get("network") == "Socket"]
        if on_socket or nccl_network == "Socket":
            where = f" (rank(s) {rank_list(on_socket)})" if on_socket else " (the given NCCL log)"
            out.append(
                (
                    f"NCCL uses NET/Socket between nodes (TCP){where}: far below the fabric's bandwidth",
                    "load the network plugin (aws-ofi-nccl / aws-ofi-rccl on Slingshot) or check "
                    "NCCL_IB_HCA / NCCL_SOCKET_IFNAME",
                )
            )
        if not any(r["interfaces"] for r in reports):
            out.append(
                (
                    "no high-speed interface (hsn*, ib*) on any node",
                    "run on the compute partition; check the site profile",
                )
            )
    return out


#: how far a profile's gpu_memory_gb may be from the GPUs' own size: an "80 GB" H100 has 79.6 GiB
GPU_MEMORY_TOLERANCE = 0.10


def gpu_memory_warning(reports: list[dict], profile_gib: float, site: str) -> str | None:
    """A WARNING and its HINT when the site profile's gpu_memory_gb is more than 10 % off the memory of the
    smallest GPU the ranks see, so `exatrain plan --site` would judge a layout against the wrong size; None
    when it matches, when the profile leaves it unset, or when no rank has a GPU."""
    seen = [r["gpu_memory_gib"] for r in reports if r.get("gpu_memory_gib")]
    if not seen or not profile_gib:
        return None
    here = min(seen)
    if abs(profile_gib - here) <= GPU_MEMORY_TOLERANCE * here:
        return None
    size = int(here)
    return (
        f"WARNING: site profile {site!r} gives gpu_memory_gb = {profile_gib:g}, but the GPUs here have "
        f"{here:.1f} GiB: exatrain plan --site would judge memory against the wrong size\n"
        f"HINT: pass --gpu-memory-gb {size} to exatrain plan, or set gpu_memory_gb = {size} in a copy of the "
        "profile"
    )


def rank_list(reports: list[dict]) -> str:
    """The ranks of `reports` as "0, 1, 5" (the first eight, then how many more)."""
    ranks = [str(r["rank"]) for r in reports]
    return ", ".join(ranks[:8]) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
