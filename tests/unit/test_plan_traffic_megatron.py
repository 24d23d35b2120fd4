"""The memory-bound bytes of the published Megatron codes' own ops (exatrain/tools/plan/traffic.py and
estimate.py, for the validation runs of docs/plan-validation.md) against independent counts on torch's CPU
kernels: Megatron-LM's fp16 optimizer step, its vocab-parallel cross entropy, its transformer layer's split,
copy and bias gradients, and its reentrant activation checkpoint; and llm-foundry's MPT block (the MPT
runs' code; their optimizer step: tests/distributed/test_plan_composer_step.py). Each test runs the ops the
code runs, under a dispatch mode that counts what they read and write (tests/unit/test_plan_traffic.py's
counters, whose rules know nothing of the model). exatrain's own model: tests/unit/test_plan_traffic.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from exatrain.models.sizes import ModelShape
from exatrain.models.transformer import TransformerLM
from exatrain.tools.plan import estimate, traffic
from tests.unit.test_plan_traffic import MemoryBytes, ReadWrite, _measured, _nbytes


def test_megatron_fp16_optimizer_moves_what_its_step_reads_and_writes():
    """estimate.OPTIMIZER_BYTES["megatron-fp16"] beyond a fused AdamW: the ops Megatron-LM's
    Float16OptimizerWithFloat16Params.step runs around its Adam with a loss scale (megatron/optimizer/
    optimizer.py), here on torch's CPU kernels: the fp16 gradients copied to fp32 main gradients, the
    unscale-and-inf-check (torch._amp_foreach_non_finite_check_and_unscale_, as there), the clipping norm
    (apex's multi_tensor_l2norm there, torch._foreach_norm here: one read of each gradient) and the fp32
    main parameters copied to fp16 (apex's multi_tensor_scale into the model's tensors there, a cast here:
    the same bytes). What it does not reproduce: apex's kernels themselves, only what their operands hold;
    the few scalars (norms, the inf flag, the scale) are the slack allowed."""
    sizes = (4096, 3000, 24)
    params16 = [torch.randn(n, dtype=torch.float16) for n in sizes]
    grads16 = [torch.randn(n, dtype=torch.float16) for n in sizes]
    main_params = [p.float() for p in params16]
    found_inf, inv_scale = torch.zeros(1), torch.full((1,), 1 / 8192)
    with ReadWrite() as counted:
        main_grads = [g.float() for g in grads16]
        torch._amp_foreach_non_finite_check_and_unscale_(main_grads, found_inf, inv_scale)
        torch._foreach_norm(main_grads)
        [p.to(torch.float16) for p in main_params]
    extra = estimate.OPTIMIZER_BYTES["megatron-fp16"] - estimate.OPTIMIZER_BYTES["adamw"]
    assert extra * sum(sizes) <= counted.total <= extra * sum(sizes) + 64
    # the planning page quotes the whole step's bytes
    planning = " ".join((Path(__file__).resolve().parents[2] / "docs/planning.md").read_text().split())
    assert f"Megatron-LM's fp16 optimizer {estimate.OPTIMIZER_BYTES['megatron-fp16']} bytes" in planning


class GatherAware(ReadWrite):
    """ReadWrite, with indexing as the kernels run it: a gather (`index`) reads the elements it picks and
    writes them, a scatter (`index_put_`) reads its values and writes them in place; both read their indices.
    Neither reads the whole tensor it indexes."""

    @staticmethod
    def _moved(func, args, kwargs, out) -> int:
        name = func.overloadpacket.__name__
        if name not in ("index", "index_put_", "index_put"):
            return ReadWrite._moved(func, args, kwargs, out)
        indices = sum(_nbytes(i) for i in args[1] if i is not None)
        if name == "index":
            return indices + 2 * _nbytes(out)
        values = args[2]
        return indices + _nbytes(values) + values.numel() * args[0].element_size()


class _MegatronCrossEntropy(torch.autograd.Function):
    """Megatron-LM's vocab-parallel cross entropy (megatron/mpu/cross_entropy.py, _VocabParallelCrossEntropy)
    on one tensor-parallel rank whose shard is the whole vocabulary: the same ops on the logits, in the same
    order and in place where it works in place; its three all-reduces over the tensor-parallel group (of one
    value per token) are left out, as a group of one has nothing to reduce."""

    @staticmethod
    def forward(ctx, logits, target):
        biggest = torch.max(logits, dim=-1)[0]
        logits.sub_(biggest.unsqueeze(dim=-1))  # in place: the logits, shifted
        flat = logits.view(-1, logits.size(-1))
        rows = torch.arange(flat.size(0))
        picked = flat[rows, target.view(-1)].clone().contiguous().view_as(target)
        torch.exp(logits, out=logits)  # the shifted logits' exponentials, into the same tensor
        total = logits.sum(dim=-1)
        loss = torch.log(total) - picked
        logits.div_(total.unsqueeze(dim=-1))  # the softmax, kept for the backward
        ctx.save_for_backward(logits, target)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, target = ctx.saved_tensors
        flat = softmax.view(-1, softmax.size(-1))
        rows = torch.arange(flat.size(0))
        flat[rows, target.view(-1)] -= 1.0  # the target's term, in place
        softmax.mul_(grad_loss.unsqueeze(dim=-1))
        return softmax, None


@pytest.mark.parametrize("loss", ["megatron", "megatron-clone"])
def test_megatron_cross_entropy_moves_what_its_ops_read_and_write(loss):
    """traffic.LOSS_BYTES for Megatron-LM's loss: the bytes per logit of its ops on fp16 logits cast to fp32
    (Megatron-LM's `output.float()`, Megatron-DeepSpeed's `float16_to_fp32`) and, for Megatron-DeepSpeed's
    copy, the clone before it, counted on the CPU with gathers reading what they pick. Per logit: the
    difference of two vocabulary sizes over the tokens, so the per-token ops (maxima, sums, the picked
    logits, the loss) drop out. What it does not reproduce: the three all-reduces of one value per token over
    the tensor-parallel group, and the GPU's kernels themselves (only what their operands hold)."""

    def counted(vocab: int, tokens: int = 64) -> int:
        torch.manual_seed(0)
        logits16 = torch.randn(tokens, vocab, dtype=torch.float16, requires_grad=True)
        target = torch.randint(0, vocab, (tokens,))
        with GatherAware() as c:
            logits = logits16.float()
            if loss == "megatron-clone":
                logits = logits.clone()
            _MegatronCrossEntropy.apply(logits, target).sum().backward()
        return c.total

    per_logit = (counted(1024) - counted(512)) / (64 * 512)
    cast = 6 + 6  # fp16 -> fp32 (read 2, write 4) and the gradient back (read 4, write 2)
    assert per_logit == traffic.LOSS_BYTES[loss] + cast


def _bias_gradient(tokens: tuple[int, int], width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output, bias, gradient) of a bf16 bias added over [s, b, width], as Megatron-LM's layers add it."""
    bias = torch.zeros(width, dtype=torch.bfloat16, requires_grad=True)
    out = torch.randn(*tokens, width, dtype=torch.bfloat16) + bias
    return out, bias, torch.randn_like(out)


@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_layer_moves_what_its_own_ops_add(tp):
    """traffic.megatron_bytes, what Megatron-LM's ParallelTransformerLayer moves beyond exatrain's block, on
    torch's CPU kernels in bf16 at one tensor-parallel rank's sizes, counted by ReadWrite: the heads' context
    permuted back to [s, b, h] and made contiguous; autograd's backward of the fused QKV output's split (a
    concatenation of the q, k and v gradients) and of the four bias adds (a sum over the tokens); less the
    two adds with which autograd sums the three input gradients of exatrain's wq, wk and wv (16-bit, as in
    a 16-bit module). The biases' own gradients (their width, once per micro-batch) are the slack allowed.
    What it does not reproduce: the tensor-parallel split itself (sizes only) and the CUDA kernels."""
    s, b, d, heads = 64, 2, 64, 4
    shape = ModelShape(dim=d, n_layers=1, n_heads=heads)
    np_, hn, hidden = heads // tp, d // heads, shape.mlp_ratio * d // tp
    bf16 = torch.bfloat16
    context = torch.randn(b, np_, s, hn, dtype=bf16)
    mixed = torch.randn(s, b, np_, 3 * hn, dtype=bf16, requires_grad=True)
    qkv = torch.split(mixed, hn, dim=-1)
    grads = [torch.randn(s, b, np_, hn, dtype=bf16) for _ in qkv]
    biases = [_bias_gradient((s, b), width) for width in (3 * d // tp, hidden, d, d)]
    summed = [torch.randn(s, b, d, dtype=bf16) for _ in range(3)]
    with ReadWrite() as megatron:
        context.permute(2, 0, 1, 3).contiguous()
        torch.autograd.grad(qkv, mixed, grads)
        for out, bias, grad in biases:
            torch.autograd.grad(out, bias, grad)
    with ReadWrite() as exatrain:
        summed[0] + summed[1] + summed[2]
    k = traffic.Kernels(shape, 96, s, elem_bytes=2, param_bytes=2, tp=tp, module_16bit=True, layer="megatron")
    per_token = sum(traffic.megatron_bytes(k).values())
    slack = 2 * sum(bias.numel() for _, bias, _ in biases)
    assert 0 <= megatron.total - exatrain.total - s * b * per_token <= slack
    blocks = traffic.block_bytes(k), traffic.block_bytes(replace(k, layer="exatrain"))
    assert blocks[0]["forward"] - blocks[1]["forward"] == traffic.megatron_bytes(k)["forward"]
    assert blocks[0]["backward"] - blocks[1]["backward"] == traffic.megatron_bytes(k)["backward"]
    assert blocks[0]["recompute"] == blocks[0]["forward"]  # a reentrant checkpoint: the whole layer again


def test_mpt_fused_cross_entropy_against_torchs():
    """traffic.head_bytes with the MPT runs' loss ("xentropy": flash-attn's fused xentropy kernels on the bf16
    logits) against torch's cross entropy on the same logits, per logit (the difference of two vocabulary
    sizes over the tokens, so that per-token values drop out). torch's side is counted on the CPU: the
    logits cast to fp32, cross entropy, its backward and the gradient cast back, by MemoryBytes (whose NLL
    rules read one log-probability per target). The xentropy
    kernels do not run on a CPU; their operands are counted from their tensors: the forward reads the
    logits and writes a loss and a log-sum-exp per token, the backward reads the logits (with the loss's
    gradient, the log-sum-exp and the labels) and writes the logits' gradient."""

    def torch_side(vocab: int, tokens: int = 64) -> int:
        torch.manual_seed(0)
        logits = torch.randn(tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
        target = torch.randint(0, vocab, (tokens,))
        with MemoryBytes() as c:
            torch.nn.functional.cross_entropy(logits.float(), target).backward()
        return c.total

    def xentropy_side(vocab: int, tokens: int = 64) -> int:
        logits = torch.empty(tokens, vocab, dtype=torch.bfloat16)
        per_token = 8 + 4 + 4  # labels, loss, log-sum-exp
        forward = _nbytes(logits) + tokens * per_token
        backward = 2 * _nbytes(logits) + tokens * (per_token + 4)  # and the loss's gradient
        return forward + backward

    def per_logit(side) -> float:
        return (side(1024) - side(512)) / (64 * 512)

    shape = ModelShape(dim=64, n_layers=1, n_heads=4)
    k = traffic.Kernels(shape, 512, 64, elem_bytes=2, param_bytes=2, module_16bit=True)
    heads = [
        traffic.head_bytes(replace(k, vocab=v, loss=loss))
        for loss in ("xentropy", "torch")
        for v in (1024, 512)
    ]
    model = ((heads[0] - heads[1]) - (heads[2] - heads[3])) / 512
    assert model == per_logit(xentropy_side) - per_logit(torch_side)
    assert per_logit(torch_side) == traffic.LOSS_BYTES["torch"] + 6 + 6  # the casts, as head_bytes adds them


def test_mpt_block_moves_what_its_own_ops_add():
    """traffic.mpt_bytes, what llm-foundry's MPTBlock (the MPT runs' code) moves beyond exatrain's block, on
    torch's CPU kernels in bf16, counted by ReadWrite: autograd's backward of the fused Wqkv output's
    qkv.chunk(3, dim=2) (a concatenation of the q, k and v gradients) and of the four bias adds (a sum over
    the tokens), and the triton attention backward's dq.copy_(dq_accum) from its fp32 accumulator; less the
    two adds with which autograd sums the three input gradients of exatrain's wq, wk and wv. The attention's
    other side kernel, _bwd_preprocess_do_o_dot, is triton's and does not run here: its operands are counted
    from their tensors (it reads o and do and writes one fp32 value per row and head). The biases' own
    gradients (their width, once per micro-batch) are the slack allowed. What it does not reproduce: the
    triton and CUDA kernels themselves."""
    b, s, d, heads = 2, 64, 64, 4
    shape = ModelShape(dim=d, n_layers=1, n_heads=heads)
    bf16, d_head = torch.bfloat16, d // heads
    mixed = torch.randn(b, s, 3 * d, dtype=bf16, requires_grad=True)
    qkv = mixed.chunk(3, dim=2)
    grads = [torch.randn(b, s, d, dtype=bf16) for _ in qkv]
    biases = [_bias_gradient((b, s), width) for width in (3 * d, d, shape.mlp_ratio * d, d)]
    o, do = (torch.randn(b, s, heads, d_head, dtype=bf16) for _ in range(2))
    dq_accum, dq = torch.randn(b, s, heads, d_head), torch.empty(b, s, heads, d_head, dtype=bf16)
    summed = [torch.randn(b, s, d, dtype=bf16) for _ in range(3)]
    with ReadWrite() as mpt:
        torch.autograd.grad(qkv, mixed, grads)
        for out, bias, grad in biases:
            torch.autograd.grad(out, bias, grad)
        dq.copy_(dq_accum)
    preprocess = _nbytes(o) + _nbytes(do) + b * s * heads * 4
    with ReadWrite() as exatrain:
        summed[0] + summed[1] + summed[2]
    k = traffic.Kernels(shape, 96, s, elem_bytes=2, param_bytes=2, module_16bit=True, layer="mpt")
    per_token = sum(traffic.mpt_bytes(k).values())
    slack = 2 * sum(bias.numel() for _, bias, _ in biases)
    assert 0 <= mpt.total + preprocess - exatrain.total - b * s * per_token <= slack
    blocks = traffic.block_bytes(k), traffic.block_bytes(replace(k, layer="exatrain"))
    assert blocks[0]["forward"] == blocks[1]["forward"] and traffic.mpt_bytes(k)["forward"] == 0
    assert blocks[0]["backward"] - blocks[1]["backward"] == traffic.mpt_bytes(k)["backward"]
    # torch's non-reentrant checkpoint, as exatrain's: the recompute stops before the last add
    assert blocks[0]["forward"] - blocks[0]["recompute"] > 0


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_a_reentrant_checkpoint_recomputes_the_last_add_too(bf16):
    """Megatron-LM's checkpoint (and DeepSpeed's) is reentrant: an autograd Function that reruns the whole
    layer in the backward, where torch's non-reentrant checkpoint (exatrain's) stops before the block's last
    residual add, whose output nothing in the block saved. Counted on the CPU on the real model with each
    block in torch's reentrant checkpoint_wrapper: it moves the last add's bytes more per recomputed block,
    what block_bytes' "recompute" adds for Kernels.layer "megatron" (the rest of that layer's count is
    test_megatron_layer_moves_what_its_own_ops_add's)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    shape, vocab, batch, seq = ModelShape(dim=64, n_layers=2, n_heads=4), 96, 4, 64
    non_reentrant = _measured(shape, vocab, batch, seq, bf16, checkpointed=True)
    torch.manual_seed(0)
    model = TransformerLM(shape, vocab, seq, 0.0)
    for name, block in list(model.layers.items()):
        model.layers[name] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.REENTRANT)
    x, y = torch.randint(0, vocab, (batch, seq)), torch.randint(0, vocab, (batch, seq))
    with MemoryBytes() as counter:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(x, y)
        loss.backward()
    k = traffic.Kernels(shape, vocab, seq, elem_bytes=2 if bf16 else 4, norm="composite")
    exatrains, megatrons = traffic.block_bytes(k), traffic.block_bytes(replace(k, layer="megatron"))
    tail = exatrains["forward"] - exatrains["recompute"]  # what the non-reentrant recompute leaves out
    assert tail > 0 and megatrons["recompute"] == megatrons["forward"]
    assert counter.total - non_reentrant == shape.n_layers * batch * seq * tail
