"""FLOPs per token (for MFU) and the peak FLOP/s of the device a rank runs on.

MFU = achieved FLOP/s / peak FLOP/s. The achieved FLOPs come from a formula for the reference model
(`transformer_flops_per_token`) or, for any other model, from one measured training step under
torch.utils.flop_counter.FlopCounterMode (`measure_flops_per_token`). The peak comes from a table of
dense bf16 tensor-core throughput by device name; CPUs have no entry (MFU is then not reported).
"""

from __future__ import annotations

from collections.abc import Callable

# dense (no sparsity) bf16 peak FLOP/s per device as torch names it, most specific first (vendor data sheets)
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("GH200", 989e12),
    ("H200", 989e12),
    ("H100 NVL", 835e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("A40", 150e12),
    ("A10", 125e12),
    ("V100", 125e12),  # V100: fp16 tensor cores (no bf16)
    ("MI300X", 1307e12),
    ("MI300A", 981e12),
    ("MI250X", 191.5e12),
    ("MI250", 181e12),  # MI250(X): per GCD
    ("MI210", 181e12),
    ("MI100", 92.3e12),
)


def peak_flops(device_name: str | None) -> float | None:
    """Peak dense bf16 FLOP/s of a device from its name (torch.cuda.get_device_name), None if unknown/CPU."""
    if not device_name:
        return None
    for key, flops in PEAK_BF16_FLOPS:
        if key.lower() in device_name.lower():
            return flops
    return None


def device_peak_flops(device) -> float | None:
    """Peak FLOP/s of a torch device (None on CPU or for a GPU not in the table)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return peak_flops(torch.cuda.get_device_name(device))


def transformer_flops_per_token(matmul_params: int, n_layers: int, dim: int, seq_len: int) -> float:
    """Training FLOPs per token of a decoder-only Transformer: 6 N + 12 L D T (PaLM, appendix B).

    N: parameters outside the embedding tables (matmul weights incl. the output head); the attention
    term counts the full T x T score and value products (no causal halving)."""
    return 6.0 * matmul_params + attention_flops_per_token(n_layers, dim, seq_len)


def attention_flops_per_token(n_layers: int, dim: int, seq_len: int) -> float:
    """The attention term of transformer_flops_per_token: 12 L D T (the T x T score and value products,
    forward and backward, no causal halving); what a fused attention kernel runs."""
    return 12.0 * n_layers * dim * seq_len


def measure_flops_per_token(train_step: Callable[[], object], tokens: int) -> float:
    """Run `train_step()` once (forward AND backward of `tokens` tokens) under FlopCounterMode and
    return the counted FLOPs per token. For models without a formula; costs one extra step, once."""
    from torch.utils.flop_counter import FlopCounterMode

    if tokens <= 0:
        raise ValueError(f"tokens={tokens}: the step must process at least one token")
    counter = FlopCounterMode(display=False)
    with counter:
        train_step()
    return counter.get_total_flops() / tokens
