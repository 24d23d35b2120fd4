"""CPU affinity of a rank against the cores it should run on (standard library only, no torch).

Expected cores, in this order:
1. the site profile's CPU mask for the rank's GPU (LUMI-G: the GCD's CCD), or on CPU-only nodes for the
   rank's local index (a user profile may list one mask per local rank);
2. else the cores of the NUMA node the rank's GPU hangs off (``/sys/bus/pci/devices/*/numa_node``);
3. else nothing is expected and the rank is reported as unchecked.
A rank is ``ok`` when its affinity equals the mask (1.) or lies within the NUMA node (2.).

Same concept as distributed/affinity.py, one layer apart: this module reads and compares masks (no torch);
that one binds and reports at start.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from exatrain.env.devices import narrowed_ids, visibility

MODES = ("warn", "strict", "off")


@dataclass(frozen=True)
class AffinityReport:
    """One rank's affinity verdict (what the rank-0 table shows)."""

    rank: int
    host: str
    gpu: str  # "cuda:N", "cpu"
    expected: str  # compressed core list, or "-" when nothing is expected
    actual: str
    verdict: str  # "ok", "unchecked", or "MISMATCH: why"

    @property
    def mismatch(self) -> bool:
        """True when the rank runs on other cores than expected."""
        return self.verdict.startswith("MISMATCH")


def mask_to_cores(mask: str) -> set[int]:
    """``"0xfe"`` -> {1, ..., 7}: bit i of the hex mask set means core i."""
    value = int(mask, 16)
    return {i for i in range(value.bit_length()) if value >> i & 1}


def parse_cpulist(text: str) -> set[int]:
    """Kernel cpulist format (``"0-3,8,10-11"``) -> set of cores."""
    cores: set[int] = set()
    for part in text.strip().split(","):
        if part:
            low, _, high = part.partition("-")
            cores.update(range(int(low), int(high or low) + 1))
    return cores


def format_ranges(numbers: Iterable[int] | None) -> str:
    """{0, 1, 2, 5} -> ``"0-2,5"`` (``"-"`` for None): core lists, and rank lists that stay short at scale."""
    if numbers is None:
        return "-"
    ranges, items = [], sorted(numbers)
    for n in items:
        if ranges and n == ranges[-1][1] + 1:
            ranges[-1][1] = n
        else:
            ranges.append([n, n])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in ranges)


def numa_cores(node: int, root: str = "/") -> set[int] | None:
    """Cores of NUMA node ``node`` from sysfs, or None where the kernel does not say."""
    path = Path(root) / f"sys/devices/system/node/node{node}/cpulist"
    try:
        return parse_cpulist(path.read_text())
    except (OSError, ValueError):
        return None


def gpu_numa_nodes(root: str = "/") -> list[int]:
    """NUMA node of each GPU in PCI bus order (NVIDIA: /proc/driver/nvidia, AMD: KFD), -1 where unknown.

    PCI bus order is how SLURM's gres and CUDA_DEVICE_ORDER=PCI_BUS_ID number GPUs.
    """
    base = Path(root)
    buses = [p.name for p in (base / "proc/driver/nvidia/gpus").glob("*")]
    for props in (base / "sys/class/kfd/kfd/topology/nodes").glob("*/properties"):
        fields = dict(line.split() for line in _read(props).splitlines() if len(line.split()) == 2)
        if fields.get("gpu_id", "0") != "0" and fields.get("location_id"):
            loc = int(fields["location_id"])  # bus << 8 | device << 3 | function
            buses.append(f"{int(fields.get('domain', 0)):04x}:{loc >> 8:02x}:{loc >> 3 & 31:02x}.{loc & 7}")
    return [
        _int(_read(base / "sys/bus/pci/devices" / bus.lower() / "numa_node"), -1) for bus in sorted(buses)
    ]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _int(text: str, default: int) -> int:
    try:
        return int(text.strip())
    except ValueError:
        return default


def physical_gpu(device_index: int, environ: Mapping[str, str] | None = None) -> int:
    """The node's GPU number behind torch device ``device_index`` after the visibility variables narrowed
    it."""
    narrowed = narrowed_ids(visibility(os.environ if environ is None else environ))
    if narrowed and device_index < len(narrowed) and narrowed[device_index].isdigit():
        return int(narrowed[device_index])
    return device_index


@dataclass(frozen=True)
class WorkerBinding:
    """What binding a torchrun worker to its mask did: ``bound`` or not, and a line saying so."""

    bound: bool
    note: str


def bind_worker(
    masks: Sequence[str], local_rank: int, per_gpu: bool, environ: Mapping[str, str] | None = None
) -> WorkerBinding:
    """Bind this process, a torchrun worker, to its CPU mask before it allocates anything, so its memory is
    first touched near its GPU. Its mask: ``per_gpu``, mask i for the node's GPU i behind local rank i after
    the visibility variables (`physical_gpu`); else (CPU profiles) mask i for local rank i. Only cores the
    process holds are used: where its task was given fewer, nothing changes and the note says why.

    The one implementation behind exatrain.init (torchrun mode) and `launch.script_runner --cpu-masks`."""
    index = physical_gpu(local_rank, environ) if per_gpu else local_rank
    what = f"GPU {index}" if per_gpu else f"local rank {index}"
    if index >= len(masks):
        return WorkerBinding(
            False,
            f"torchrun mode: worker {local_rank} not bound: no mask for its {what} (the "
            f"job's masks name {len(masks)})",
        )
    cores, held = mask_to_cores(masks[index]), set(os.sched_getaffinity(0))
    if not cores <= held:
        return WorkerBinding(
            False,
            f"torchrun mode: worker {local_rank} not bound to its mask (cores "
            f"{format_ranges(cores)}): its task holds only {format_ranges(held)}",
        )
    try:
        os.sched_setaffinity(0, cores)
    except OSError as e:
        return WorkerBinding(
            False,
            f"torchrun mode: worker {local_rank} not bound to its mask (cores "
            f"{format_ranges(cores)}): {e.strerror or e}",
        )
    whose = "its GPU" if per_gpu else "its local rank"
    return WorkerBinding(True, f"torchrun mode: each worker bound itself to the profile's mask of {whose}")


def expected_cores(
    gpu: int | None, local_rank: int, masks: Sequence[str], root: str = "/"
) -> tuple[set[int] | None, str]:
    """The cores this rank should run on and where that expectation comes from (``mask``, ``numa``, ``none``).

    ``gpu`` is the node's GPU number (None on CPU ranks); masks are the profile's, one per GPU (GPU
    profiles) or per local rank (CPU profiles).
    """
    index = gpu if gpu is not None else local_rank
    if masks and index < len(masks):
        return mask_to_cores(masks[index]), "mask"
    numa = gpu_numa_cores(gpu, root)
    return (numa, "numa") if numa is not None else (None, "none")


def gpu_numa_cores(gpu: int | None, root: str = "/") -> set[int] | None:
    """Cores of the NUMA node GPU ``gpu`` hangs off, or None (CPU rank, or sysfs does not say)."""
    if gpu is None:
        return None
    nodes = gpu_numa_nodes(root)
    return numa_cores(nodes[gpu], root) if gpu < len(nodes) and nodes[gpu] >= 0 else None


def check_rank(
    rank: int,
    host: str,
    gpu: int | None,
    local_rank: int,
    masks: Sequence[str],
    actual: set[int] | None = None,
    root: str = "/",
) -> AffinityReport:
    """This rank's verdict; ``actual`` defaults to ``os.sched_getaffinity(0)`` (what the kernel enforces).

    With a profile mask the affinity must equal it, and where sysfs knows the GPU's NUMA node the mask
    itself must lie on that node (a wrong profile is reported too); without a mask the affinity must lie
    within the GPU's NUMA node.
    """
    actual = set(os.sched_getaffinity(0)) if actual is None else actual
    expected, source = expected_cores(gpu, local_rank, masks, root)
    verdict = _verdict(expected, source, actual)
    numa = gpu_numa_cores(gpu, root) if source == "mask" else None
    if verdict == "ok" and numa is not None and not expected <= numa:
        verdict = f"MISMATCH: profile mask cores {format_ranges(expected - numa)} are off the GPU's NUMA node"
    label = f"cuda:{gpu}" if gpu is not None else "cpu"
    return AffinityReport(rank, host, label, format_ranges(expected), format_ranges(actual), verdict)


def _verdict(expected: set[int] | None, source: str, actual: set[int]) -> str:
    if expected is None:
        return "unchecked"
    if source == "mask" and actual != expected:
        missing, extra = expected - actual, actual - expected
        why = []
        if missing:
            why.append(f"lacks {format_ranges(missing)}")
        if extra:
            why.append(f"also on {format_ranges(extra)}")
        return "MISMATCH: " + ", ".join(why) + " (profile mask)"
    if source == "numa" and not actual <= expected:
        return f"MISMATCH: cores {format_ranges(actual - expected)} are off the GPU's NUMA node"
    return "ok"


def format_table(reports: Sequence[AffinityReport]) -> str:
    """One plain-text table, a row per rank (fits job logs; no terminal codes)."""
    head = ("rank", "host", "GPU", "expected cores", "actual cores", "verdict")
    rows = [head] + [(str(r.rank), r.host, r.gpu, r.expected, r.actual, r.verdict) for r in reports]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in rows
    )
