"""GPU monitoring per node: a background sampler writing RUN_DIR/monitor/HOST.jsonl, and its summary.

Readers, first that works: the vendors' Python bindings (nvidia-ml-py's `pynvml`, then AMD's `amdsmi`, which
needs libamd_smi.so of ROCm on the node), else the machine-readable output of `nvidia-smi` or `rocm-smi`.
Each sample is one JSON line
{"time": unix seconds, "host": ..., "gpus": [{"index", "name", "util_pct", "mem_used_mib", "mem_total_mib",
"power_w", "temp_c"}, ...]}. No GPU and no tool: no samples, no file.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

NVIDIA_SMI_QUERY = "index,name,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu"
NVIDIA_SMI_ARGS = ["--query-gpu=" + NVIDIA_SMI_QUERY, "--format=csv,noheader,nounits"]
ROCM_SMI_ARGS = [
    "--showuse",
    "--showmemuse",
    "--showmeminfo",
    "vram",
    "--showpower",
    "--showtemp",
    "--showproductname",
    "--json",
]


def _number(text) -> float | None:
    try:
        return float(str(text).strip().split()[0])
    except (ValueError, IndexError):
        return None  # "[N/A]", "[Not Supported]"


def parse_nvidia_smi(text: str) -> list[dict]:
    """GPUs from `nvidia-smi --query-gpu=<NVIDIA_SMI_QUERY> --format=csv,noheader,nounits` output."""
    gpus = []
    for line in text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 7:
            continue
        index, name, util, used, total, power, temp = fields
        gpus.append(
            {
                "index": int(index),
                "name": name,
                "util_pct": _number(util),
                "mem_used_mib": _number(used),
                "mem_total_mib": _number(total),
                "power_w": _number(power),
                "temp_c": _number(temp),
            }
        )
    return gpus


def parse_rocm_smi(text: str) -> list[dict]:
    """GPUs from `rocm-smi <ROCM_SMI_ARGS>` JSON output ({"card0": {...}, ...})."""
    data = json.loads(text)
    gpus = []
    for card, values in sorted(data.items()):
        if not card.startswith("card"):
            continue

        def pick(*words, without=None, values=values):
            return next(
                (
                    v
                    for k, v in values.items()
                    if all(w in k.lower() for w in words) and not (without and without in k.lower())
                ),
                None,
            )

        used, total = _number(pick("vram", "used")), _number(pick("vram", "total", without="used"))
        gpus.append(
            {
                "index": int(card.removeprefix("card")),
                "name": pick("card series") or pick("product") or "",
                "util_pct": _number(pick("gpu use")),
                "mem_used_mib": used / 2**20 if used is not None else None,
                "mem_total_mib": total / 2**20 if total is not None else None,
                "power_w": _number(pick("power")),
                "temp_c": _number(pick("temperature", "junction") or pick("temperature")),
            }
        )
    return gpus


def _read_pynvml() -> list[dict] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - pynvml.NVMLError and friends: no driver here
        return None
    gpus = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        gpus.append(
            {
                "index": i,
                "name": pynvml.nvmlDeviceGetName(h),
                "util_pct": float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
                "mem_used_mib": mem.used / 2**20,
                "mem_total_mib": mem.total / 2**20,
                "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
                "temp_c": float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
            }
        )
    return gpus


@functools.cache
def amdsmi_module():
    """AMD's `amdsmi` bindings, imported once; None where the package or its libamd_smi.so is missing.

    Without the library the package prints two lines to stdout and then fails; they are kept out of the
    output by swapping sys.stdout, which is process-wide: so the import happens here once, and GpuMonitor
    calls this in the thread that creates it, never on its sampling thread while the trainer prints."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            import amdsmi
    except Exception:  # noqa: BLE001 - ImportError, or the package's own failure to load libamd_smi.so
        return None
    return amdsmi


def _read_amdsmi() -> list[dict] | None:
    """AMD GPUs through AMD's `amdsmi` bindings; None where the package, its libamd_smi.so or the driver is
    missing."""
    amdsmi = amdsmi_module()
    if amdsmi is None:
        return None
    try:
        amdsmi.amdsmi_init()
    except Exception:  # noqa: BLE001 - amdsmi.AmdSmiException and friends: no driver or no AMD GPU
        return None
    try:
        return [_amd_gpu(amdsmi, i, h) for i, h in enumerate(amdsmi.amdsmi_get_processor_handles())]
    except Exception:  # noqa: BLE001 - a reading this library version or GPU does not support
        return None
    finally:
        with contextlib.suppress(Exception):
            amdsmi.amdsmi_shut_down()


def _amd_gpu(amdsmi, index: int, handle) -> dict:
    """One GPU's sample from amdsmi: activity in %, VRAM in MB (amdsmi's unit), power in W, junction
    temperature in C. Readings a GPU does not support come back as "N/A" (or raise): None."""
    vram = amdsmi.amdsmi_get_gpu_vram_usage(handle)
    power = _optional(lambda: amdsmi.amdsmi_get_power_info(handle)) or {}
    temp = _optional(
        lambda: amdsmi.amdsmi_get_temp_metric(
            handle, amdsmi.AmdSmiTemperatureType.HOTSPOT, amdsmi.AmdSmiTemperatureMetric.CURRENT
        )
    )
    name = _optional(lambda: amdsmi.amdsmi_get_gpu_asic_info(handle)["market_name"])
    util = amdsmi.amdsmi_get_gpu_activity(handle)["gfx_activity"]
    return {
        "index": index,
        "name": name or "",
        "util_pct": _number(util),
        "mem_used_mib": _number(vram["vram_used"]),
        "mem_total_mib": _number(vram["vram_total"]),
        "power_w": _amd_watts(power),
        "temp_c": _number(temp),
    }


def _amd_watts(power: dict) -> float | None:
    """Socket power in W: current_socket_power on MI300 and later, average_socket_power on MI250X (LUMI) and
    earlier; the other one is 0 or a "not supported" value (N/A, UINT16/UINT32 max)."""
    for key in ("current_socket_power", "average_socket_power"):
        watts = _number(power.get(key))
        if watts and watts < 0xFFFF:
            return watts
    return None


def _optional(read):
    try:
        return read()
    except Exception:  # noqa: BLE001 - amdsmi raises for readings a GPU does not support
        return None


def _read_tool(tool: str, args: list[str], parse) -> list[dict] | None:
    path = shutil.which(tool)
    if path is None:
        return None
    try:
        out = subprocess.run([path, *args], capture_output=True, text=True, timeout=30, check=True).stdout
        return parse(out)
    except (subprocess.SubprocessError, OSError, ValueError):
        return None


def read_gpus() -> tuple[str, list[dict]]:
    """(source, GPUs) from the first reader that works; ("none", []) without GPUs or tools."""
    readers = (
        ("nvidia-ml-py", _read_pynvml),
        ("amdsmi", _read_amdsmi),
        ("nvidia-smi", lambda: _read_tool("nvidia-smi", NVIDIA_SMI_ARGS, parse_nvidia_smi)),
        ("rocm-smi", lambda: _read_tool("rocm-smi", ROCM_SMI_ARGS, parse_rocm_smi)),
    )
    for source, read in readers:
        gpus = read()
        if gpus:
            return source, gpus
    return "none", []


class GpuMonitor:
    """Samples this node's GPUs every `interval_s` seconds on a daemon thread into RUN_DIR/monitor/HOST.jsonl.

    Run it on one rank per node (local rank 0); `stop()` ends it and returns the summary lines."""

    def __init__(self, run_dir: str | Path, interval_s: float = 10.0, host: str | None = None):
        self.host = host or socket.gethostname()
        self.path = Path(run_dir) / "monitor" / f"{self.host}.jsonl"
        self.interval_s = interval_s
        self._stop = threading.Event()
        amdsmi_module()  # imported here, not on the sampling thread (see amdsmi_module)
        self._thread = threading.Thread(target=self._run, name="exatrain-gpu-monitor", daemon=True)

    def start(self) -> "GpuMonitor":
        """Take the first sample now and keep sampling in the background (nothing when no GPU is seen)."""
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            source, gpus = read_gpus()
            if not gpus:
                return  # no GPU or no tool: nothing to monitor
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(
                    json.dumps({"time": time.time(), "host": self.host, "source": source, "gpus": gpus})
                    + "\n"
                )
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> list[str]:
        """Stop sampling (waits for a sample in progress) and summarise this node's GPUs."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return summarize(self.path) if self.path.exists() else []


def read_samples(path: str | Path) -> list[dict]:
    """The samples of one HOST.jsonl file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def summarize(path: str | Path) -> list[str]:
    """One line per GPU: mean utilisation, peak memory, mean power over the samples of one node's file."""
    samples = read_samples(path)
    by_gpu: dict[int, list[dict]] = {}
    for s in samples:
        for g in s["gpus"]:
            by_gpu.setdefault(g["index"], []).append(g)
    host = samples[0]["host"] if samples else Path(path).stem
    lines = []
    for index, gs in sorted(by_gpu.items()):
        util = _mean([g["util_pct"] for g in gs])
        mem = max((g["mem_used_mib"] or 0.0) for g in gs) / 1024
        power = _mean([g["power_w"] for g in gs])
        busy = f"{util:.0f} % busy on average" if util is not None else "utilisation unknown"
        watts = f", {power:.0f} W on average" if power is not None else ""
        lines.append(
            f"GPU {index} on {host}: {busy} over {len(gs)} samples (peak memory {mem:.1f} GiB{watts})"
        )
    return lines


def _mean(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None
