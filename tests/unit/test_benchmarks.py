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
    matmul_weights = s.n_layers * 12 * s.dim ** 2 + 512 * s.dim  # blocks + output head (norms are tiny)
    fpt = flops_per_token(model, 128)
    attention = 12 * s.n_layers * s.dim * 128
    assert 6 * matmul_weights + attention <= fpt <= 6 * matmul_weights * 1.01 + attention


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the benchmark would run")
def test_gpu_mfu_without_cuda_says_so():
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu_mfu"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr, r.stderr
