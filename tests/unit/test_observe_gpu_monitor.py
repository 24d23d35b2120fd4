"""The per-node GPU sampler against a stand-in `nvidia-smi` script on PATH.

No GPU here: the stand-in prints what `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` prints
for two H100s, with GPU 0's utilisation rising by 10 % per call, so the summary's mean is checkable.
"""

import importlib.util
import os
import sys
import time

import pytest

from exatrain.observe import gpu_monitor
from exatrain.observe.gpu_monitor import GpuMonitor, read_gpus, read_samples

READ_PYNVML = gpu_monitor._read_pynvml  # the real reader (fixtures below replace it)

STAND_IN = """#!/bin/sh
# stand-in nvidia-smi (no GPU on this machine): answers the monitor's --query-gpu call
case "$*" in *--query-gpu=index,name,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu*) \
;; *) exit 9;; esac
n=$(( $(cat "$0.count" 2>/dev/null || echo 0) + 1 )); echo $n > "$0.count"
echo "0, NVIDIA H100 80GB HBM3, $((n * 10)), $((n * 1024)), 81559, 300.5, 55"
echo "1, NVIDIA H100 80GB HBM3, [N/A], 0, 81559, [N/A], 30"
"""


@pytest.fixture
def stand_in_nvidia_smi(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text(STAND_IN)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(
        gpu_monitor, "_read_pynvml", lambda: None
    )  # the bindings, if installed, find no driver
    return script


def test_sampler_writes_host_jsonl_and_summarises(tmp_path, stand_in_nvidia_smi):
    monitor = GpuMonitor(tmp_path / "run", interval_s=0.05, host="node7").start()
    path = tmp_path / "run" / "monitor" / "node7.jsonl"
    deadline = time.monotonic() + 300  # a wait, not a timing assertion: a loaded machine may be slow
    while (not path.exists() or len(read_samples(path)) < 3) and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = monitor.stop()
    samples = read_samples(path)
    n = len(samples)
    assert n >= 3 and all(s["source"] == "nvidia-smi" and s["host"] == "node7" for s in samples)
    assert [s["gpus"][0]["util_pct"] for s in samples] == [10.0 * i for i in range(1, n + 1)]
    gpu1 = samples[0]["gpus"][1]
    assert gpu1["util_pct"] is None and gpu1["power_w"] is None and gpu1["temp_c"] == 30.0  # [N/A] fields
    mean = 10.0 * (n + 1) / 2
    assert (
        lines[0]
        == f"GPU 0 on node7: {mean:.0f} % busy on average over {n} samples (peak memory {n:.1f} GiB, "
        "300 W on average)"
    )
    assert lines[1] == f"GPU 1 on node7: utilisation unknown over {n} samples (peak memory 0.0 GiB)"


def test_nvidia_ml_py_without_a_driver_gives_way_to_nvidia_smi(stand_in_nvidia_smi, monkeypatch):
    """The real nvidia-ml-py bindings (the test extra installs them) on this machine, which has no NVIDIA
    driver: `nvmlInit` fails, so the bindings' reader gives nothing and the next reader (the stand-in tool)
    answers."""
    import pynvml  # installed by the test extra: a missing package fails here rather than skipping

    with pytest.raises(pynvml.NVMLError):
        pynvml.nvmlInit()  # the premise: no driver here
    monkeypatch.setattr(gpu_monitor, "_read_pynvml", READ_PYNVML)
    assert READ_PYNVML() is None
    source, gpus = read_gpus()
    assert source == "nvidia-smi" and [g["index"] for g in gpus] == [0, 1]


def test_no_gpu_tool_means_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # neither nvidia-smi nor rocm-smi
    monkeypatch.setattr(gpu_monitor, "_read_pynvml", lambda: None)
    monitor = GpuMonitor(tmp_path / "run", interval_s=0.05, host="cpu1").start()
    assert monitor.stop() == [] and not (tmp_path / "run" / "monitor").exists()


ROCM_SMI_JSON = """{
  "card0": {"Temperature (Sensor edge) (C)": "38.0", "Temperature (Sensor junction) (C)": "41.0",
            "Average Graphics Package Power (W)": "92.0", "GPU use (%)": "87",
            "GPU memory use (%)": "12", "VRAM Total Used Memory (B)": "8589934592",
            "VRAM Total Memory (B)": "68702699520", "Card Series": "AMD INSTINCT MI250X"},
  "card1": {"Temperature (Sensor junction) (C)": "39.0", "Average Graphics Package Power (W)": "N/A",
            "GPU use (%)": "0", "VRAM Total Memory (B)": "68702699520", "VRAM Total Used Memory (B)": "0",
            "Card Series": "AMD INSTINCT MI250X"},
  "system": {"Driver version": "6.3.6"}
}"""


def test_rocm_smi_json():
    """The key names `rocm-smi --showuse --showmeminfo vram --showpower --showtemp --showproductname --json`
    prints (values made up; the used/total order differs between cards on purpose)."""
    gpus = gpu_monitor.parse_rocm_smi(ROCM_SMI_JSON)
    assert gpus[0] == {
        "index": 0,
        "name": "AMD INSTINCT MI250X",
        "util_pct": 87.0,
        "mem_used_mib": 8192.0,
        "mem_total_mib": 65520.0,
        "power_w": 92.0,
        "temp_c": 41.0,
    }
    assert (
        gpus[1]["mem_used_mib"] == 0.0 and gpus[1]["mem_total_mib"] == 65520.0 and gpus[1]["power_w"] is None
    )
    assert len(gpus) == 2


# A stand-in for AMD's `amdsmi` Python bindings (no AMD GPU and no libamd_smi.so here). Function names, enum
# names, exception class and the shapes of the returned values are those of amdsmi 7.0.2's
# amdsmi_interface.py (PyPI wheel; AMD SMI Python API reference): dicts with "N/A" for an unsupported reading,
# VRAM in MB, power in W, temperatures as int. Values are those of a LUMI-G node's two MI250X GCDs.
STAND_IN_AMDSMI = """
import enum

class AmdSmiException(Exception):
    pass

class AmdSmiLibraryException(AmdSmiException):
    pass

class AmdSmiTemperatureType(enum.IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2

class AmdSmiTemperatureMetric(enum.IntEnum):
    CURRENT = 0
    MAX = 1

FAIL_INIT = False
CALLS = []

def amdsmi_init(flag=None):
    CALLS.append("init")
    if FAIL_INIT:
        raise AmdSmiLibraryException("Error code: 8 | AMDSMI_STATUS_INIT_ERROR")

def amdsmi_shut_down():
    CALLS.append("shut_down")

def amdsmi_get_processor_handles():
    return ["handle-0", "handle-1"]

def amdsmi_get_gpu_activity(handle):
    return {"gfx_activity": 87 if handle == "handle-0" else 0, "umc_activity": 12, "mm_activity": "N/A"}

def amdsmi_get_gpu_vram_usage(handle):
    return {"vram_total": 65520, "vram_used": 8192 if handle == "handle-0" else 10}

def amdsmi_get_power_info(handle):
    if handle == "handle-1":
        raise AmdSmiLibraryException("Error code: 2 | AMDSMI_STATUS_NOT_SUPPORTED")
    return {"socket_power": 0, "current_socket_power": "N/A", "average_socket_power": 92, \
"gfx_voltage": "N/A",
            "soc_voltage": "N/A", "mem_voltage": "N/A", "power_limit": 500}

def amdsmi_get_temp_metric(handle, sensor_type, metric):
    if not isinstance(sensor_type, AmdSmiTemperatureType) or not isinstance(metric, AmdSmiTemperatureMetric):
        raise TypeError("the real bindings raise AmdSmiParameterException for a plain int")
    return {AmdSmiTemperatureType.EDGE: 38, AmdSmiTemperatureType.HOTSPOT: 41}[sensor_type]

def amdsmi_get_gpu_asic_info(handle):
    return {"market_name": "AMD Instinct MI250X", "vendor_id": "0x1002", \
"vendor_name": "Advanced Micro Devices Inc.",
            "device_id": "0x740c", "target_graphics_version": "gfx90a"}
"""


@pytest.fixture
def stand_in_amdsmi(tmp_path, monkeypatch):
    """The stand-in `amdsmi` first on sys.path (and no real one imported before); pynvml finds no driver."""
    (tmp_path / "amdsmi").mkdir()
    (tmp_path / "amdsmi" / "__init__.py").write_text(STAND_IN_AMDSMI)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    monkeypatch.setattr(gpu_monitor, "_read_pynvml", lambda: None)
    gpu_monitor.amdsmi_module.cache_clear()
    yield
    sys.modules.pop("amdsmi", None)
    gpu_monitor.amdsmi_module.cache_clear()


def test_amdsmi_bindings_come_after_pynvml_and_before_the_tools(stand_in_amdsmi, stand_in_nvidia_smi):
    import amdsmi

    source, gpus = gpu_monitor.read_gpus()
    assert source == "amdsmi"  # the nvidia-smi stand-in on PATH is not asked
    assert gpus[0] == {
        "index": 0,
        "name": "AMD Instinct MI250X",
        "util_pct": 87.0,
        "mem_used_mib": 8192.0,
        "mem_total_mib": 65520.0,
        "power_w": 92.0,
        "temp_c": 41.0,
    }
    assert gpus[1]["util_pct"] == 0.0 and gpus[1]["power_w"] is None  # a reading the GPU does not support
    assert amdsmi.CALLS == ["init", "shut_down"]


def test_amdsmi_init_failure_falls_back_to_the_tools(stand_in_amdsmi, stand_in_nvidia_smi):
    import amdsmi

    amdsmi.FAIL_INIT = True  # e.g. libamd_smi.so present but no amdgpu driver on this node
    source, gpus = gpu_monitor.read_gpus()
    assert source == "nvidia-smi" and len(gpus) == 2


def test_real_amdsmi_without_its_library_falls_back_quietly(monkeypatch, capsys):
    """The real `amdsmi` package (test extra) without libamd_smi.so on this machine: its import fails (after
    printing to stdout); the reader returns None and nothing reaches this process's output."""
    if importlib.util.find_spec("amdsmi") is None:  # find_spec does not run the package (importorskip would)
        pytest.skip("needs the amdsmi package (bash scripts/install.sh test)")
    monkeypatch.delitem(sys.modules, "amdsmi", raising=False)
    gpu_monitor.amdsmi_module.cache_clear()
    try:
        assert gpu_monitor._read_amdsmi() is None
        assert gpu_monitor.amdsmi_module.cache_info().currsize == 1  # tried once, not on every sample
    finally:
        gpu_monitor.amdsmi_module.cache_clear()
    assert capsys.readouterr().out == ""
