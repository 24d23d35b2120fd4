"""Bytes the memory-bound kernels of one training step move (torch-free): the step-time model's memory term.

Matrix products and the attention kernel (F.scaled_dot_product_attention: flash attention, no T x T scores
in memory) are counted as FLOPs at matmul_tflops (estimate.py). Every other kernel of the reference model
(models/transformer.py) is memory-bound: it reads its inputs and writes its outputs once, so its time is
those bytes over the memory bandwidth. This module counts them per token, from the ops exatrain's eager
step dispatches (one kernel per aten op), with the element size of each tensor:

- the residual stream is fp32 (4 bytes) unless FSDP keeps bf16 parameters (then 2): the embeddings' dtype;
- matrix products write `e` bytes per element (2 under bf16 autocast, 4 in fp32);
- RMSNorm runs in fp32 (autocast's fp32 list on GPUs; the residual is fp32 on the CPU). On a GPU it is
  torch's fused kernel (`_fused_rms_norm`: read x, write y and 1/rms; its backward reads dy, x and 1/rms
  and writes dx, then reads dy and x again for the weight's gradient); on a CPU torch decomposes it into
  pow, mean, add, rsqrt, mul, mul forward and 15 ops backward (counted one by one below);
- under bf16 autocast each linear layer casts its fp32 input to bf16 (read 4, write 2 bytes per element;
  its backward casts the gradient back: read 2, write 4), and fp32 weights are cast once per forward;
- the loss casts the logits to fp32, runs log-softmax (read 4, write 4 bytes per logit), and backward
  writes the NLL gradient (4), runs log-softmax's backward (read 8, write 4) and casts back to bf16;
  published codes compute it their own way (`loss`, LOSS_BYTES: Megatron-LM's vocab-parallel cross
  entropy, in place on the fp32 logits);
- gradient accumulation: from a step's second micro-batch (or pipeline microbatch) on, autograd adds each
  new weight gradient into the accumulated one in place (read both, write the sum: 12 bytes per fp32
  element); FSDP2 with bf16 parameters first converts the unsharded bf16 gradient to an fp32 accumulator
  (read 2, write 4) and then adds each later one into it (read 4 and 2, write 4). Published codes
  accumulate their own way (`accumulation`): a 16-bit add after the first micro-batch (Megatron-LM's fp16
  main_grad: read 2 and 2, write 2), DeepSpeed's bf16 optimizer, which after every micro-batch casts
  the bf16 gradient to fp32 and adds it into its fp32 copy (read 2, write 4; read 4 and 4, write 4), or
  torch's FullyShardedDataParallel (FSDP1, under Composer), which reduce-scatters every micro-batch
  (fsdp1_gradient_bytes);
- torch's DistributedDataParallel (exatrain's replicated layouts without TP or PP; Megatron-LM's DDP=torch
  around any layout), with gradient_as_bucket_view off as by default: once per step (the earlier
  micro-batches run under no_sync) its reducer copies each gradient into its bucket, dividing it by the
  ranks on the way (mul_out: read, write), and after the all-reduce copies the bucket back into the
  gradient (copy_: read, write): 4 x the gradient's element size per element (`ddp_bytes`);
- a code whose norms read and write 16-bit tensors with 16-bit parameters (`module_16bit`: Megatron-LM's
  Float16Module and DeepSpeed's bf16 engine, which use no autocast; llm-foundry's LPLayerNorm under FSDP's
  bf16 parameters; published runs only, exatrain's RMSNorm runs on autocast's fp32 list) casts nothing but
  the logits for the loss: its fused norm reads and writes 16-bit tensors (fp32 inside), and autograd sums
  16-bit gradients;
- with dropout (`model.dropout` > 0) each dropout (the embeddings' sum, the MLP's output; in Megatron-LM's
  layer, a published code's, the attention's output too: `dropout_branches`) is on a GPU
  torch's fused kernel (native_dropout: read x, write y and a bool mask; backward: read dy and the mask,
  write dx) and on a CPU its decomposition (bernoulli_ writes a mask of x's dtype, div_ scales it in
  place, x * mask; backward: dy * mask). The attention's dropout runs inside the fused attention kernel
  (no bytes); kept in memory (`materialised`), the probabilities are dropped out like the rest;
- a published code's own layer (`layer`): Megatron-LM's splits one QKV product's output, copies the heads'
  context back, and has four biases whose gradients are summed over the tokens (megatron_bytes); the MPT
  runs' MPTBlock splits its QKV output and has four biases too, and its triton attention's backward runs two
  kernels besides its main one (mpt_bytes); BLOOM's adds ALiBi's bias into the scores with baddbmm, which
  copies it into the result first (alibi_bytes).

The formula is written out with its derivation in docs/planning.md; tests/unit/test_plan_traffic.py compares
it with the bytes a dispatch mode counts on the real model's ops on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from exatrain.models import ModelShape

NORM_KERNELS = ("fused", "composite")  # a GPU's fused RMSNorm kernel; the CPU's decomposition
# exatrain's (autograd, FSDP2); Megatron-LM's fp16 main_grad; DeepSpeed's bf16 optimizer; torch's FSDP1; none
ACCUMULATIONS = ("autograd", "16-bit", "deepspeed-bf16", "fsdp1", "none")
ATTENTION_KERNELS = ("fused", "materialised")  # flash attention; scores and softmax kept in memory
# exatrain's block; Megatron-LM's ParallelTransformerLayer (megatron_bytes); llm-foundry's MPTBlock
# (mpt_bytes)
LAYERS = ("exatrain", "megatron", "mpt")
# Bytes per fp32 logit of the loss's own kernels (the logits' cast to fp32 and back not included), by the
# code that computes it. torch's cross entropy (exatrain): log-softmax (read 4, write 4), NLL's backward
# (write 4), log-softmax's backward (read 8, write 4). Megatron-LM's vocab-parallel cross entropy
# (megatron/mpu/cross_entropy.py, _VocabParallelCrossEntropy, on every tensor-parallel rank's vocabulary
# shard): max (read 4), sub_ (read 4, write 4), exp into itself (read 4, write 4), sum (read 4), div_ (read
# 4, write 4), and backward mul_ by the loss's gradient (read 4, write 4). Megatron-DeepSpeed's copy (BLOOM's
# and the LUMI runs' code) clones the logits before it (read 4, write 4: bigscience-workshop's
# Megatron-DeepSpeed PR 155, "cloning is required for backward hook to work properly")
LOSS_BYTES = {
    "torch": 8 + 4 + 12,
    "megatron": 4 + 8 + 8 + 4 + 8 + 8,
    "megatron-clone": 8 + 4 + 8 + 8 + 4 + 8 + 8,
}
# Fused cross-entropy kernels that read the logits in their own dtype (no cast to fp32): elements read or
# written per logit. flash-attn's xentropy (the MPT runs' code: llm-foundry's default `fused_crossentropy`)
# reads each logit in its forward, which writes one loss and one log-sum-exp per token, and reads it again
# in its backward, which writes its gradient
FUSED_LOSS_ACCESSES = {"xentropy": 3}


@dataclass(frozen=True)
class Kernels:
    """What the byte count depends on: the model, the dtypes and which kernels run."""

    shape: ModelShape
    vocab: int
    seq_len: int
    elem_bytes: int  # matrix products' outputs: 2 under bf16 autocast, 4 in fp32
    param_bytes: int = 4  # the parameters' dtype in the forward (FSDP's param_dtype): the residual's
    tp: int = 1
    sequence_parallel: bool = False
    loss_parallel: bool = False
    norm: str = "fused"
    attention: str = "fused"
    dropout: bool = False  # model.dropout > 0: dropout kernels on the embeddings and the MLP output
    # the block's branches that end in a dropout of its width: exatrain's MLP (1); Megatron-LM's transformer
    # layer drops out the attention's output too (2: Code.dropout_branches)
    dropout_branches: int = 1
    # whose transformer layer: exatrain's block, or Megatron-LM's ParallelTransformerLayer ("megatron": one
    # fused QKV product split three ways, the heads' context copied back to [s, b, h], biases; megatron_bytes;
    # and its reentrant checkpoint, which recomputes the whole layer: block_bytes), or llm-foundry's MPTBlock
    # ("mpt": the same split and biases, the triton attention's side kernels; mpt_bytes)
    layer: str = "exatrain"
    # ALiBi's bias added into the materialised scores by baddbmm with beta = 1 (BLOOM's Megatron-DeepSpeed):
    # torch copies the bias into the scores' tensor first, then the product reads it back (alibi_bytes)
    score_bias: bool = False
    module_16bit: bool = False  # 16-bit norms and parameters: nothing cast but the logits (Code.norms_16bit)
    accumulation: str = "autograd"  # ACCUMULATIONS: how the code accumulates gradients over micro-batches
    shard: int = 1  # ranks an FSDP group shards the parameters over (dp_shard)
    data_parallel: int = 1  # data-parallel ranks (dp_replicate x dp_shard): FSDP1's division factors
    ddp: bool = False  # torch's DistributedDataParallel reduces the gradients (its bucket copies: ddp_bytes)
    loss: str = "torch"  # LOSS_BYTES: whose cross entropy

    @property
    def residual(self) -> int:
        """Bytes per element of the residual stream (the embeddings' output dtype, kept by the adds)."""
        return 2 if self.elem_bytes == 2 and self.param_bytes == 2 else 4

    @property
    def autocast(self) -> bool:
        """bf16 autocast around fp32 or bf16 parameters (casts, fp32 norms): 16-bit products, not a 16-bit
        module."""
        return self.elem_bytes == 2 and not self.module_16bit

    @property
    def embedding_bytes(self) -> int:
        """Bytes per element of the embeddings' tables and outputs: the parameters' under 16-bit products."""
        return self.param_bytes if self.elem_bytes == 2 else 4

    @property
    def gpu(self) -> bool:
        """A GPU's fused kernels (RMSNorm, dropout), else the CPU's decompositions: `norm` says which."""
        return self.norm == "fused"


def _norm_forward(k: Kernels) -> tuple[float, float]:
    """(bytes per token per model-width element, bytes per token) of one RMSNorm's forward."""
    if k.module_16bit:  # the fused kernel on 16-bit tensors: read x, write y; write 1/rms (fp32)
        return 2 * k.residual, 4
    cast = 6 if k.residual == 2 else 0  # autocast's fp32 list: a bf16 input is cast up first
    if k.norm == "fused":
        return cast + 8, 4  # read x, write y (fp32); write 1/rms
    # pow (r, w), mean (r; w 1), add_ eps (r 1, w 1), rsqrt (r 1, w 1), x * rstd (r, r 1, w), * weight (r, w)
    return cast + 28, 4 + 8 + 8 + 4


def _norm_backward(k: Kernels) -> tuple[float, float]:
    """(bytes per token per width element, bytes per token) of one RMSNorm's backward."""
    if k.module_16bit:  # read dy and x, write dx; the weight's gradient reads dy and x again; read 1/rms
        return 5 * k.residual, 4
    cast = 6 if k.residual == 2 else 0
    if k.norm == "fused":
        return cast + 12 + 8, 4  # dx: read dy, x, write dx; weight gradient: read dy, x again; read 1/rms
    # weight grad: dy * y_hat (12), sum over tokens (4); dy * weight (8); the input's gradient: * x (12),
    # * rstd (8, r 1), sum (4, w 1), rstd's chain (pow, mul, mul on 1 element: 8 + 8 + 12), / D (8),
    # pow (8), * 2 (8), * (12), + the direct path (12)
    return cast + 12 + 4 + 8 + 12 + 8 + 4 + 8 + 8 + 8 + 12 + 12, 4 + 4 + 8 + 8 + 12


def norm_bytes(k: Kernels) -> dict[str, float]:
    """Bytes per token of one norm's own kernels over the whole width (forward, backward): what a test that
    cannot observe the GPU's fused norm leaves out of a count."""
    (f_d, f_1), (b_d, b_1) = _norm_forward(k), _norm_backward(k)
    d = k.shape.dim
    return {"forward": f_d * d + f_1, "backward": b_d * d + b_1}


def _dropout(k: Kernels, e: int) -> tuple[int, int, int]:
    """(forward, backward, last op's) bytes per element of one dropout of `e`-byte elements. The last op
    is what a checkpointed block does not recompute when the dropout ends the block's branch: x * mask,
    whose output nothing saved (the GPU's one kernel writes the mask with it and runs again)."""
    if k.gpu:  # native_dropout with a bool mask
        return 2 * e + 1, 2 * e + 1, 0
    return e + 2 * e + 3 * e, 3 * e, 3 * e  # bernoulli_ (w), div_ (r, w), x * mask (r r, w); dy * mask


def block_bytes(k: Kernels) -> dict[str, float]:
    """Bytes per token of one block's memory-bound kernels: forward, backward and the forward that
    activation checkpointing recomputes (torch's non-reentrant checkpoint stops before the block's last
    residual add, whose output nothing in the block saved; Megatron-LM's reentrant one reruns it all)."""
    d, e, r = k.shape.dim, k.elem_bytes, k.residual
    hidden = k.shape.mlp_ratio * d / k.tp  # the MLP's width on this rank
    sp = k.tp if k.sequence_parallel else 1  # norms and residual adds on a sequence shard
    scores = k.shape.n_heads / k.tp * k.seq_len  # attention scores per token on this rank
    nf_d, nf_1 = _norm_forward(k)
    nb_d, nb_1 = _norm_backward(k)
    add = (2 * r + e) * d / sp  # x + branch: read both, write x
    fwd = 2 * (nf_d * d + nf_1) / sp + 2 * add + 2 * e * hidden  # two norms, two adds, GELU
    bwd = 2 * (nb_d * d + nb_1) / sp + 3 * e * hidden  # two norms' backward, GELU's backward
    # autograd sums the gradients of a tensor used twice: the residual x (norm and add), twice per block,
    # and the attention norm's output (wq, wk, wv: two adds), in fp32 after the casts' backward (16-bit in a
    # 16-bit module)
    bwd += 2 * 3 * r * d / sp + 2 * 3 * (r if k.module_16bit else 4) * d
    if k.autocast:
        casts = 4 * 6 * d  # the norm outputs cast for wq, wk, wv and w1 (whole tensors under TP)
        fwd += casts
        bwd += casts  # their gradients cast back
        if r == 4:  # the two branches' gradients, fp32 from the residual, cast to bf16 for wo's and w2's
            bwd += 2 * 6 * d
    if k.attention == "materialised":
        fwd += 2 * e * scores  # softmax (scale and causal mask fused): read scores, write probabilities
        bwd += 3 * e * scores  # its backward: read the probabilities and their gradient, write the scores'
    if k.layer not in LAYERS:
        raise ValueError(f"Kernels.layer {k.layer!r}: one of {', '.join(LAYERS)}")
    if k.layer != "exatrain":  # a published code's own layer: what it moves beyond exatrain's block
        extra = {"megatron": megatron_bytes, "mpt": mpt_bytes}[k.layer](k)
        fwd, bwd = fwd + extra["forward"], bwd + extra["backward"]
    if k.score_bias:
        fwd += alibi_bytes(k)
    tail = add
    if k.dropout:
        f, b, last = _dropout(k, e)
        # the MLP output (and the attention's, where the code drops it out too); the probabilities
        elements = k.dropout_branches * d / sp + (scores if k.attention == "materialised" else 0)
        fwd += f * elements
        bwd += b * elements
        tail += last * d / sp  # the MLP output's dropout ends the branch, before the last add
    # Megatron-LM's checkpoint (and DeepSpeed's, in Megatron-DeepSpeed) is reentrant: an autograd Function
    # that reruns the whole layer, its last add too
    return {"forward": fwd, "backward": bwd, "recompute": fwd if k.layer == "megatron" else fwd - tail}


def megatron_bytes(k: Kernels) -> dict[str, float]:
    """Bytes per token that Megatron-LM's ParallelTransformerLayer (megatron/model/transformer.py, also
    Megatron-DeepSpeed's) moves beyond exatrain's block, whose kernels block_bytes counts: forward, the
    heads' context permuted back to [s, b, h] by .contiguous() (read, write); backward, the split of the
    fused QKV output into q, k and v, whose gradients autograd concatenates (read three, write one), but
    no sum of three input gradients (exatrain's wq, wk and wv each return one), and the bias gradients
    (QKV's and the first MLP product's on this rank's shard; the attention output's and the MLP output's,
    added after the tensor-parallel reduction): autograd's sum over the tokens reads each gradient once.
    Not counted: the QKV product's own bias add, whose bytes depend on the torch version (an in-place add,
    a copy before a beta = 1 product, or none in cuBLASLt's epilogue)."""
    d, e, r = k.shape.dim, k.elem_bytes, k.residual
    sp = k.tp if k.sequence_parallel else 1
    hidden = k.shape.mlp_ratio * d / k.tp
    forward = 2 * e * d / k.tp  # context_layer.permute(2, 0, 1, 3).contiguous()
    backward = 2 * e * 3 * d / k.tp  # SplitBackward: cat of the q, k and v gradients
    backward -= 2 * 3 * (r if k.module_16bit else 4) * d  # block_bytes' sum of wq's, wk's and wv's
    backward += e * (3 * d / k.tp + hidden) + 2 * e * d / sp  # the four bias gradients
    return {"forward": forward, "backward": backward}


def mpt_bytes(k: Kernels) -> dict[str, float]:
    """Bytes per token that llm-foundry's MPTBlock (the MPT runs' code: biases in its four products, the
    triton flash attention its yamls name) moves beyond exatrain's block. Backward, as Megatron-LM's layer:
    the fused Wqkv output's chunk into q, k and v, whose gradients autograd concatenates, instead of the sum
    of three input gradients, and the four bias gradients; and two kernels of the triton attention's
    backward around its main one: the rows' dot of the output and its gradient (read both, write one fp32
    value per head) and the fp32 dq accumulator copied into dq (read 4, write e). Forward, nothing more: the
    attention writes [b, s, heads, d_head], which MPT views as [b, s, d], and the biases are added in the
    products' cuBLASLt epilogue (torch 2.1 on CUDA flattens the 3-D input into addmm)."""
    d, e = k.shape.dim, k.elem_bytes
    heads = k.shape.n_heads / k.tp
    attention = 2 * e * d / k.tp + 4 * heads + (4 + e) * d / k.tp
    return {"forward": 0.0, "backward": megatron_bytes(k)["backward"] + attention}


def alibi_bytes(k: Kernels) -> float:
    """Bytes per token of the copy that puts ALiBi's bias into the scores' tensor: BLOOM's code calls
    torch.baddbmm(alibi, q, k^T, beta=1.0), whose meta function copies the bias (a [b x heads, 1, s] tensor
    broadcast over the queries: read once, its rows stay in cache) into the result before the product (its
    read of that result: score_product_bytes)."""
    heads = k.shape.n_heads / k.tp
    return k.elem_bytes * heads * (k.seq_len + 1)  # write the scores' bias, read each head's row


def head_bytes(k: Kernels) -> float:
    """Bytes per token of the output side: the final norm, its cast, and the loss over the vocabulary."""
    d = k.shape.dim
    v = k.vocab / (k.tp if k.loss_parallel else 1)
    nf_d, nf_1 = _norm_forward(k)
    nb_d, nb_1 = _norm_backward(k)
    out = (nf_d + nb_d) * d + nf_1 + nb_1
    # the loss's kernels per logit (LOSS_BYTES); per token, as torch's: NLL's forward reads one logit and one
    # id (8 bytes), its backward writes the ids' gradient (4 + ids; Megatron-LM's per-token maxima, sums and
    # gathered logits are of that order, about 20 bytes against the vocabulary shard's thousands of logits)
    out += 4 + 8 + 8
    if k.autocast:
        out += 2 * 6 * d  # the norm output's cast and its gradient's
    if k.loss in FUSED_LOSS_ACCESSES:  # the logits as the head wrote them
        return out + FUSED_LOSS_ACCESSES[k.loss] * k.elem_bytes * v
    if k.loss not in LOSS_BYTES:
        raise ValueError(f"Kernels.loss {k.loss!r}: one of {', '.join([*LOSS_BYTES, *FUSED_LOSS_ACCESSES])}")
    out += LOSS_BYTES[k.loss] * v
    if k.elem_bytes == 2:
        out += 2 * 6 * v  # the 16-bit logits cast to fp32 for the loss, their gradient cast back
    return out


def embedding_bytes(k: Kernels, batch: int) -> float:
    """Bytes per token of the embeddings (first stage): the gathers, the sum with the position table and
    their backward, except the token table's gradient (`embedding_grad_bytes`, per micro-batch)."""
    d, p = k.shape.dim, k.embedding_bytes
    per_sample = 1 / batch  # the position rows are gathered and reduced once per micro-batch
    fwd = 2 * p * d + 8 + 2 * p * d * per_sample + (2 + per_sample) * p * d  # gathers (+ ids), + pos
    # the token table's backward reads dx (+ ids); pos: sum dx over the batch, then its table's backward
    bwd = p * d + 8 + p * d + p * d * per_sample + 2 * p * d * per_sample
    if k.dropout:  # the sum's dropout, forward and backward
        drop_fwd, drop_bwd, _ = _dropout(k, p)
        fwd += drop_fwd * d
        bwd += drop_bwd * d
    return fwd + bwd


def embedding_grad_bytes(k: Kernels) -> float:
    """Bytes of the token table's gradient per micro-batch: embedding_dense_backward writes the whole
    (vocabulary-sharded under TP) table."""
    return k.embedding_bytes * k.vocab / k.tp * k.shape.dim


def weight_cast_bytes(k: Kernels) -> float:
    """Bytes per forward of autocast's casts of fp32 matmul weights to bf16 (read 4, write 2) and of their
    gradients back (read 2, write 4), per block; none in fp32 or with bf16 parameters."""
    if not k.autocast or k.param_bytes == 2:
        return 0.0
    d = k.shape.dim
    return 12 * (4 + 2 * k.shape.mlp_ratio) * d * d / k.tp


def head_cast_bytes(k: Kernels) -> float:
    """As weight_cast_bytes, for the output head's weight (vocabulary x width, sharded under TP)."""
    if not k.autocast or k.param_bytes == 2:
        return 0.0
    return 12 * k.vocab * k.shape.dim / k.tp


@dataclass(frozen=True)
class RankWork:
    """How much of the model one rank runs per step: a pipeline rank's own stages, or the average rank's
    shares (n_layers / pp blocks, 1 / pp of the embeddings and of the head)."""

    tokens: int  # tokens per step through this rank's stage (global batch x T / data-parallel ranks)
    blocks: float  # blocks this rank runs
    recomputed_blocks: float  # of them, checkpointed (their forward runs again in backward)
    forwards: int  # micro-batch forwards per step (autocast casts the weights once per forward)
    batch: int  # samples per micro-batch
    embeddings: float  # 1 on the rank of the first stage, else 0 (the average rank: 1 / pp)
    head: float  # 1 on the rank of the last stage (final norm, head, loss), else 0 (average: 1 / pp)


def step_bytes(k: Kernels, w: RankWork) -> float:
    """Bytes of one rank's memory-bound kernels in one step."""
    b = block_bytes(k)
    per_block = b["forward"] + b["backward"]
    tokens = w.tokens * (w.blocks * per_block + w.recomputed_blocks * b["recompute"])
    tokens += w.tokens * (w.head * head_bytes(k) + w.embeddings * embedding_bytes(k, w.batch))
    casts = w.forwards * (
        (w.blocks + w.recomputed_blocks) * weight_cast_bytes(k) / 2  # a recompute casts the weights again
        + w.blocks * weight_cast_bytes(k) / 2
        + w.head * head_cast_bytes(k)
    )
    grads = accumulation_bytes(k, w) + ddp_bytes(k, w)
    return tokens + casts + w.forwards * w.embeddings * embedding_grad_bytes(k) + grads


def score_product_bytes(k: Kernels, w: RankWork) -> float:
    """Bytes one rank's attention products move in a step when the scores are kept in memory
    (`materialised`; none for the fused kernel, which keeps them on chip). Six batched products per block:
    QK^T writes the T x T scores and PV reads the probabilities; in the backward dP = dO V^T writes their
    gradient, dV = P^T dO reads the probabilities, dQ = dS K and dK = dS^T Q read the scores' gradient. Each
    moves one T x T matrix per head and two T x d_head ones (its other operand, its output), once; a
    recomputed block runs the forward's two again. With d_head near the chip's FLOPs-per-byte ratio these
    products are as much memory-bound as compute-bound (estimate.products_seconds takes the slower)."""
    if k.attention != "materialised":
        return 0.0
    heads = k.shape.n_heads / k.tp
    head_dim = k.shape.dim / k.shape.n_heads
    per_product = k.elem_bytes * heads * (k.seq_len + 2 * head_dim)  # per token
    moved = w.tokens * per_product * (6 * w.blocks + 2 * w.recomputed_blocks)
    if k.score_bias:  # QK^T with beta = 1 reads the scores' tensor (ALiBi's bias) it adds into
        moved += w.tokens * k.elem_bytes * heads * k.seq_len * (w.blocks + w.recomputed_blocks)
    return moved


def gradient_elements(k: Kernels, w: RankWork) -> float:
    """Weight-gradient elements of the rank's part of the model, unsharded by FSDP (where it accumulates):
    its blocks' matrices (split under TP) and norm weights, the embedding tables (token table split under
    TP) and the head with the final norm. (analytic._tensors, the measured layout's closed form, also splits
    the position table under TP; counted whole here, a difference of (tp - 1) / tp x seq_len x dim.)"""
    d = k.shape.dim
    block = (4 + 2 * k.shape.mlp_ratio) * d * d / k.tp + 2 * d
    return w.blocks * block + root_elements(k, w)


def root_elements(k: Kernels, w: RankWork) -> float:
    """Of gradient_elements, those outside the blocks: the embedding tables, the final norm and the head
    (an FSDP root unit's)."""
    d, v = k.shape.dim, k.vocab / k.tp
    return w.embeddings * (v + k.seq_len) * d + w.head * (v * d + d)


def fsdp1_divisors(data_parallel: int) -> tuple[int, float]:
    """FSDP1's gradient pre- and post-division factors for `data_parallel` ranks (torch's
    DefaultState._get_gradient_predivide_factor: the pre-factor doubles while it divides the ranks and stays
    below their quotient; the post-factor is the rest): 2 and 1 at 2 ranks, 2 and 2 at 4, 4 and 2 at 8."""
    pre = 1
    while data_parallel % pre == 0 and data_parallel / pre > pre:
        pre *= 2
    return pre, data_parallel / pre


def fsdp1_gradient_bytes(
    elements: float,
    shard_elements: float,
    micro_batches: int,
    grad_bytes: int,
    data_parallel: int,
    unshards: int = 2,
) -> float:
    """Bytes torch's FullyShardedDataParallel (FSDP1, FULL_SHARD, reduce-scattering every micro-batch as
    Composer runs it) moves per step for one flat parameter of `elements` (its shard: `shard_elements`)
    beyond the products and the collectives, with gradients of `grad_bytes` (the mixed-precision param_dtype;
    the reduction in the same dtype). Per micro-batch: autograd assembles the flat gradient from its
    parameters' views (read and write it), FSDP1 pre-divides it in place (read, write), and on the shard
    after the reduce-scatter post-divides (read, write), casts it to the fp32 parameter's dtype (read,
    write 4) and, from the second micro-batch on, adds it into the saved shard (read 4 and 4, write 4);
    each of the `unshards` gathers (forward and backward; the root unit keeps its parameters from forward
    to backward: one) first casts the fp32 parameter shard to the low precision (read 4, write).
    tests/distributed/test_plan_fsdp1_traffic.py counts the same bytes on real FSDP1 ranks."""
    pre, post = fsdp1_divisors(data_parallel)
    low = grad_bytes != 4  # mixed precision: parameter and gradient casts
    full = 2 * grad_bytes * (1 + (pre > 1))
    shard = 2 * grad_bytes * (post > 1) + low * ((grad_bytes + 4) + unshards * (4 + grad_bytes))
    later = 12 * (micro_batches - 1) * shard_elements
    return micro_batches * (full * elements + shard * shard_elements) + later


def ddp_bytes(k: Kernels, w: RankWork) -> float:
    """Bytes torch DDP's reducer moves per step besides the all-reduce (module docstring): each gradient
    into its bucket divided by the ranks, and the reduced bucket back, once per step; the gradients have
    the parameters' dtype. tests/distributed/test_plan_ddp_traffic.py counts them on real DDP ranks."""
    return 4 * k.param_bytes * gradient_elements(k, w) if k.ddp else 0.0


def accumulation_bytes(k: Kernels, w: RankWork) -> float:
    """Bytes of one step's gradient accumulation (module docstring): none with one micro-batch."""
    if k.accumulation == "deepspeed-bf16":  # every micro-batch, the first included
        return 18 * w.forwards * gradient_elements(k, w)
    if k.accumulation == "fsdp1":  # every micro-batch reduce-scatters; the shards accumulate
        n, root = gradient_elements(k, w), root_elements(k, w)  # the root unit gathers once
        blocks = n - root
        return sum(
            fsdp1_gradient_bytes(e, e / k.shard, w.forwards, k.param_bytes, k.data_parallel, unshards)
            for e, unshards in ((blocks, 2), (root, 1))
        )
    if k.accumulation == "none" or w.forwards < 2:
        return 0.0
    if k.accumulation == "16-bit":
        per_element = 6 * (w.forwards - 1)
    elif k.param_bytes == 2:  # FSDP2's bf16 gradients into an fp32 accumulator
        per_element = 6 + 10 * (w.forwards - 1)
    else:
        per_element = 12 * (w.forwards - 1)
    return per_element * gradient_elements(k, w)
