"""Memory arithmetic of `exatrain plan` (torch-free): optimizer state, activation estimate, verdict.

Parameter and gradient shard sizes are MEASURED from the layout (see exatrain.tools.plan.layout); this module
only adds what a layout cannot show: AdamW state per parameter element, transient buffers, and an
activation ESTIMATE from a per-block formula.

Activation formula (bytes saved for backward per block, in units of B*T*D, B = samples per (pipeline)
microbatch, T = sequence length, D = model width), read off the tensors autograd saves for the reference block
in models/transformer.py with flash attention (no T x T score matrix is kept). In fp32 (CPU runs, torch 2.13),
4 bytes per element, per block:

    each RMSNorm's input and normalised input (x, x*rstd)   4    (/ tp with sequence parallel)
    norm outputs saved by wq/wk/wv and w1                   2    (whole under TP: the all-gathered input)
    q, k, v and the attention output (SDPA)                 4    (/ tp: heads are sharded; wo's input is a
                                                                  view of the attention output)
    w1's output (GELU input) and GELU's output (w2 input)   8    (/ tp: the MLP width is sharded)
                                                           --
                                                           18 elements = 72 bytes per B*T*D without TP

(checked against the saved tensors of one process, with and without activation checkpointing, in
tests/unit/test_plan.py, and of 2 real ranks under TP and TP + SP in tests/distributed/test_plan_memory.py).
The embeddings keep only the token ids: their sum is block 0's residual input, counted in the block.

Under bf16 autocast (GPU runs) it is not 18 x 2: MEASURED on an H100 (torch 2.11, benchmarks/gpu_memory.py,
benchmarks/RESULTS.md), autocast runs RMSNorm in fp32, so the residual stream and the norms' inputs are kept
in fp32 (2 x 4 bytes), and eager autocast casts the fp32 norm output to bf16 once per consumer (wq, wk, wv,
w1: 4 x 2 bytes); q, k, v, the attention output (wo's input is a view of it) and the MLP's 8 are bf16 (24
bytes): 40 bytes per B*T*D. torch.compile'd blocks keep 34 (one cast per norm: 4; 22 in the sharded terms;
that split is assumed, the total measured). Besides, autocast keeps a bf16 copy of every fp32 matmul weight
for backward (2 bytes per weight element, once per rank: `weight_copy_bytes`).

Activation checkpointing keeps only each checkpointed block's input (1 B*T*D elements) plus one block's full
set while it is recomputed in backward. Head (last stage): the final norm's fp32 input (4 bytes; in fp32 on
the CPU also its normalised input: 8), / tp with sequence parallel, its output as the output head's whole
input (all-gathered under sequence parallel; 2 bytes in bf16, 4 in fp32) and the fp32 log-probs (4 bytes per
B*T*V) are kept; at the start of backward the log-probs' gradient and the logits' gradient add 8 bytes per
B*T*V for a moment (`head_backward_bytes`); / tp with loss_parallel. With dropout > 0 each block keeps its
MLP output's dropout mask (1 byte per element; the attention's dropout keeps none in the fused kernel). It
is an estimate: allocator slack, the CUDA context and temporary buffers of kernels are not in it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from exatrain.models import ModelShape

ADAMW_STATE_BYTES = (
    8  # exp_avg + exp_avg_sq, fp32 each, per parameter element (plus a scalar step per tensor)
)
STEP_BYTES = 4  # AdamW's `step` is one fp32 scalar tensor per parameter tensor
# fp32: B*T*D elements saved by one block as (the norms' inputs and normalised inputs (/ tp with sequence
# parallel), the norm outputs (whole under TP), terms sharded by TP); module docstring
FP32_BLOCK = (4, 2, 12)
FULL_BLOCK = sum(FP32_BLOCK)  # fp32: B*T*D elements saved by one block without TP
HEAD_NORM_BYTES = {4: 8, 2: 4}  # per B*T*D, by element size: what the final norm keeps of its fp32 input
# bf16 autocast: bytes per B*T*D saved by one block as (fp32 residual, bf16 casts of the norm outputs (whole
# under TP), terms sharded by TP); measured on an H100 with benchmarks/gpu_memory.py (module docstring)
BF16_BLOCK = {"eager": (8, 8, 24), "compiled": (8, 4, 22)}
GIB = 1024**3
TIGHT_FRACTION = (
    0.9  # above this share of the GPU the verdict says "tight": allocator slack and context eat the rest
)


@dataclass(frozen=True)
class ActivationSpec:
    """What the activation estimate of one rank depends on."""

    shape: ModelShape
    vocab: int
    seq_len: int
    batch: int  # samples per pipeline microbatch (= micro batch without PP)
    elem_bytes: int  # 2 when computing in bf16, 4 in fp32
    tp: int = 1
    sequence_parallel: bool = False
    loss_parallel: bool = False
    ac: str = "none"  # none, full, every
    ac_every: int = 2
    dropout: bool = False
    compiled: bool = False  # blocks run under torch.compile (inductor keeps fewer tensors)


def block_activation_bytes(s: ActivationSpec) -> float:
    """Bytes one block keeps for backward for one microbatch (no checkpointing)."""
    btd = s.batch * s.seq_len * s.shape.dim
    sp = s.tp if s.sequence_parallel else 1
    if s.elem_bytes == 4:
        residual, outputs, sharded = FP32_BLOCK
        per_btd = 4 * (residual / sp + outputs + sharded / s.tp)
    else:
        residual, casts, sharded = BF16_BLOCK["compiled" if s.compiled else "eager"]
        per_btd = residual / sp + casts + sharded / s.tp
    # the MLP output's dropout mask (bool; on the sequence shard under SP); the attention's dropout is
    # drawn inside the fused kernel and keeps no mask (measured: xl at dropout 0.1 on one H200 added 0.60
    # GiB, one mask per block and the embeddings', benchmarks/RESULTS.md)
    masks = btd / sp if s.dropout else 0
    return btd * per_btd + masks


def checkpointed_blocks(n_blocks: int, s: ActivationSpec) -> int:
    """How many of a stage's blocks run under activation checkpointing (every k-th from the first)."""
    if s.ac == "full":
        return n_blocks
    if s.ac == "every":
        return math.ceil(n_blocks / s.ac_every)
    return 0


def stage_activation_bytes(n_blocks: int, last: bool, s: ActivationSpec) -> float:
    """Bytes kept for backward by one pipeline stage (or the whole model) for one microbatch."""
    btd = s.batch * s.seq_len * s.shape.dim
    sp = s.tp if s.sequence_parallel else 1
    full = block_activation_bytes(s)
    n_ckpt = checkpointed_blocks(n_blocks, s)
    blocks = (n_blocks - n_ckpt) * full + n_ckpt * btd * s.elem_bytes / sp
    if n_ckpt:
        blocks += full  # one checkpointed block is recomputed (whole) at a time during backward
    head = 0.0
    if last:  # the final norm's fp32 input (a sequence shard under SP), its output (gathered whole for the
        # output head under SP), the fp32 log-probs
        head = btd * (HEAD_NORM_BYTES[s.elem_bytes] / sp + s.elem_bytes) + 4 * _logits(s)
    return blocks + head


def _logits(s: ActivationSpec) -> float:
    """Logit elements of one microbatch on this rank (vocabulary-sharded with loss parallel)."""
    return s.batch * s.seq_len * s.vocab / (s.tp if s.loss_parallel else 1)


def head_backward_bytes(last: bool, s: ActivationSpec) -> float:
    """What the loss's backward adds for a moment on the last stage: the gradients of the fp32 log-probs and
    of the logits (8 bytes per logit; measured on an H100 as the whole step's peak above the end of
    forward)."""
    return 8 * _logits(s) if last else 0.0


def weight_copy_bytes(n_blocks: int, last: bool, s: ActivationSpec) -> float:
    """bf16 copies of fp32 matmul weights that autocast keeps for backward (none in fp32 or with FSDP's bf16
    parameters): 2 bytes per weight element of the blocks that keep their activations, and of the output
    head."""
    if s.elem_bytes == 4:
        return 0.0
    d = s.shape.dim
    kept = n_blocks - checkpointed_blocks(n_blocks, s) + (1 if checkpointed_blocks(n_blocks, s) else 0)
    per_block = (4 + 2 * s.shape.mlp_ratio) * d * d / s.tp
    return 2 * (kept * per_block + (s.vocab * d / s.tp if last else 0))


def microbatches_in_flight(schedule: str, pp: int, pp_rank: int, microbatches: int, chunks: int) -> int:
    """Microbatches whose activations one pipeline rank holds at its peak (per model chunk it owns).

    No PP: 1. GPipe: all of them. 1F1B: rank p holds pp - p. Interleaved 1F1B (Megatron's warm-up count):
    2 (pp - p - 1) + (chunks - 1) pp + 1 chunk-microbatches, at most all of them.
    """
    if pp == 1:
        return 1
    if schedule == "gpipe":
        return microbatches * chunks
    if schedule == "interleaved_1f1b":
        return min(microbatches * chunks, 2 * (pp - pp_rank - 1) + (chunks - 1) * pp + 1)
    return min(microbatches, pp - pp_rank)


def optimizer_bytes(param_elements: int, param_tensors: int) -> int:
    """AdamW state of a rank's parameter shards: two fp32 moments per element and one step per tensor."""
    return param_elements * ADAMW_STATE_BYTES + param_tensors * STEP_BYTES


def gib(n: float) -> str:
    """Bytes as GiB (MiB below 1 GiB), e.g. '3.21 GiB'."""
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


def over(total_bytes: float, gpu_gb: float | None) -> bool:
    """Whether `total_bytes` exceed a GPU of `gpu_gb` GiB (False without a GPU size): the verdict's
    'does not fit', and what `--search` drops."""
    return bool(gpu_gb) and total_bytes > gpu_gb * GIB


def verdict(total_bytes: float, gpu_gb: float | None) -> str:
    """'fits', 'tight' (above 90 % of the GPU) or 'does not fit'; 'unknown' without a GPU size."""
    if not gpu_gb:
        return (
            "unknown (no GPU memory size: pass --gpu-memory-gb, or --site with a profile that sets "
            "gpu_memory_gb)"
        )
    share = total_bytes / (gpu_gb * GIB)
    if over(total_bytes, gpu_gb):
        return f"does not fit ({share:.0%} of {gpu_gb:g} GiB)"
    if share > TIGHT_FRACTION:
        return f"tight ({share:.0%} of {gpu_gb:g} GiB)"
    return f"fits ({share:.0%} of {gpu_gb:g} GiB)"
