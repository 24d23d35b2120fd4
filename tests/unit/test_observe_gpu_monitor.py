"""The per-node GPU sampler against a stand-in `nvidia-smi` script on PATH.

No GPU here: the stand-in prints what `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` prints
for two H100s, with GPU 0's utilisation rising by 10 % per call, so the summary's mean is checkable.
"""

import os
import time

import pytest

from exatrain.observe import gpu_monitor
from exatrain.observe.gpu_monitor import GpuMonitor, read_samples

STAND_IN = """#!/bin/sh
# stand-in nvidia-smi (no GPU on this machine): answers the monitor's --query-gpu call
case "$*" in *--query-gpu=index,name,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu*) ;; *) exit 9;; esac
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
    monkeypatch.setattr(gpu_monitor, "_read_pynvml", lambda: None)  # the bindings, if installed, find no driver
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
    assert lines[0] == f"GPU 0 on node7: {mean:.0f} % busy on average over {n} samples (peak memory {n:.1f} GiB, 300 W on average)"
    assert lines[1] == f"GPU 1 on node7: utilisation unknown over {n} samples (peak memory 0.0 GiB)"


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
    assert gpus[0] == {"index": 0, "name": "AMD INSTINCT MI250X", "util_pct": 87.0, "mem_used_mib": 8192.0,
                       "mem_total_mib": 65520.0, "power_w": 92.0, "temp_c": 41.0}
    assert gpus[1]["mem_used_mib"] == 0.0 and gpus[1]["mem_total_mib"] == 65520.0 and gpus[1]["power_w"] is None
    assert len(gpus) == 2
