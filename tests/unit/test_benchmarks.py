"""The GPU benchmark's arithmetic and its refusal to run without a GPU (it cannot run on CI machines)."""

import subprocess
import sys

import pytest
import torch

from benchmarks.gpu_mfu import flops_per_token
from exatrain.models.transformer import build_model
from tests.conftest import ROOT


def test_flops_per_token_is_palms_formula():
    model = build_model("small", 512, 128)
    s = model.shape
    matmul_weights = s.n_layers * 12 * s.dim**2 + 512 * s.dim  # blocks + output head (norms are tiny)
    fpt = flops_per_token(model, 128)
    attention = 12 * s.n_layers * s.dim * 128
    assert 6 * matmul_weights + attention <= fpt <= 6 * matmul_weights * 1.01 + attention


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the benchmark would run")
def test_gpu_mfu_without_cuda_says_so():
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_mfu"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr, r.stderr


def test_gpu_mfu_code_path_runs_on_the_cpu_and_every_side_trains_the_same_model():
    """The GPU benchmark's own smoke mode (--device cpu: no measurement) runs every side it can compare, so
    its code cannot rot between the rare runs on a GPU; each side's first loss (the same weights on the same
    batch, before any update) must agree (FSDP's bf16 parameters: within bf16's rounding), or the sides would
    not be like for like. A named size and a
    DIMxLAYERSxHEADS one (the shape of a published run) both run."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.gpu_mfu",
            "--device",
            "cpu",
            "--sizes",
            "tiny,64x2x4",
            "--seq-len",
            "32",
            "--batch",
            "2",
            "--steps",
            "1",
            "--reps",
            "1",
            "--warmup",
            "1",
            "--variants",
            "plain,exatrain,fsdp",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    first = {}
    for line in r.stdout.splitlines():
        if "built and warmed up" in line:
            size, side = line.split()[:2]
            first.setdefault(size, {})[side] = float(
                line.split("warm-up losses ")[1].split(")")[0].split(",")[0]
            )
    assert set(first) == {"tiny", "64x2x4"}, r.stdout
    for losses in first.values():
        assert set(losses) == {"plain", "exatrain", "fsdp"}, r.stdout
        assert losses["plain"] == losses["exatrain"], first  # fp32 weights on both: equal as printed
        # the FSDP side computes with bf16 parameters: within bf16's rounding (8 bits of mantissa) of the loss
        assert abs(losses["fsdp"] - losses["plain"]) < 0.01, first
    assert first["tiny"]["plain"] != first["64x2x4"]["plain"]  # two different models
    assert "tiny   ratio exatrain/plain tokens/s" in r.stdout and "64x2x4 ratio exatrain/plain" in r.stdout


def test_engines_benchmark_rotates_the_order_so_each_engine_holds_every_place():
    from benchmarks.engines import ENGINES, MIN_ROUNDS, order

    names = list(ENGINES)
    rounds = [order(r, names) for r in range(len(names))]
    assert all(sorted(r) == sorted(names) for r in rounds)
    assert all(sorted(r[place] for r in rounds) == sorted(names) for place in range(len(names)))
    assert MIN_ROUNDS >= 5


def test_engines_benchmark_refuses_fewer_than_five_rounds():
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks.engines", "--rounds", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "--rounds 2: fewer than 5 rounds" in r.stderr, r.stderr


def test_plan_cpu_reads_the_doctors_table_and_predicts_with_it(tmp_path):
    """benchmarks/plan_cpu.py's first two phases on one CPU rank: it finds the [hardware] table in the real
    doctor's output (string values such as `source = "measured"` included) and `exatrain plan --time`
    predicts a step from the profile it writes, so the benchmark cannot rot between its rare runs. The
    training phase and the comparison are the benchmark's, not this test's."""
    from benchmarks import plan_cpu

    hardware = plan_cpu.hardware_lines(1, 16, tmp_path)
    assert hardware.startswith("[hardware]\n") and "matmul_tflops = " in hardware, hardware
    assert "hbm_gbs = " in hardware and "attention_tflops = " in hardware, hardware
    plan = plan_cpu.predicted(1, plan_cpu.profile(1, hardware, tmp_path), 16, tmp_path)
    assert plan["step_time_s"] > 0 and plan["breakdown"]["compute_s"] > 0, plan
