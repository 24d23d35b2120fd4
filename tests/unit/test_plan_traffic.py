"""The memory-bound bytes of the step-time model (exatrain/tools/plan/traffic.py) against an independent
count: a TorchDispatchMode that sees every aten op the real reference model dispatches in a forward and
backward on the CPU and sums the bytes of each memory-bound op's tensor inputs and outputs.

The counter knows nothing of the model; its rules are about kernels, not about this model: views (outputs
sharing an input's storage, unless the op writes in place) move nothing; matrix products and the attention
kernel are compute (their FLOPs are the compute term); a gather (embedding, nll_loss) reads only the rows it
picks; nll_loss's backward uses its input only for the shape. The closed form leaves out terms that scale
with the width alone (the norms' weights, read once per micro-batch): it agrees within 0.04 % on every case
here; the tolerance is 1 % at B x T = 256 tokens. What the CPU cannot check: the GPU's fused RMSNorm
kernel (counted from its arguments, not observed; a 16-bit module's count leaves the norms out of both
sides), the bf16 residual of FSDP's bf16 parameters (CPU autocast does not run RMSNorm in fp32) and the
split under tensor and sequence parallelism. The published Megatron codes' own ops (their optimizer step,
cross entropy, layer and checkpoint): tests/unit/test_plan_traffic_megatron.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.checkpoint import checkpoint

from exatrain.distributed.parallelize import apply_ac
from exatrain.models.sizes import ModelShape
from exatrain.models.transformer import TransformerLM
from exatrain.tools.plan import traffic

COMPUTE = ("mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product")
FACTORIES = ("empty_like", "empty", "empty_strided", "new_empty")  # allocate: move nothing
FILLS = ("bernoulli_", "fill_", "zero_", "uniform_", "normal_")  # write their output, read nothing


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class MemoryBytes(TorchDispatchMode):
    """Sum of bytes read and written by every memory-bound op dispatched under it."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name.startswith(COMPUTE):
            return out
        ins = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        outs = [a for a in tree_flatten(out)[0] if isinstance(a, torch.Tensor)]
        inplace = any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)
        storages = {t.untyped_storage().data_ptr() for t in ins}
        if not inplace and outs and all(o.untyped_storage().data_ptr() in storages for o in outs):
            return out  # a view
        moved = sum(map(_nbytes, ins)) + sum(map(_nbytes, outs))
        if name in FACTORIES:
            return out
        if name in FILLS:
            moved = sum(map(_nbytes, outs))
        elif name == "embedding":  # reads the rows it gathers, not the table
            moved = 2 * _nbytes(outs[0]) + _nbytes(ins[1])
        elif name == "nll_loss_forward":  # reads one log-probability per target
            moved = _nbytes(ins[1]) + ins[1].numel() * ins[0].element_size() + sum(map(_nbytes, outs))
        elif name == "nll_loss_backward":  # writes zeros and one value per target; `self` gives the shape
            moved -= _nbytes(ins[1])
        self.total += moved
        return out


class ReadWrite(TorchDispatchMode):
    """Bytes every aten op reads and writes: the tensors it reads, and what it writes (its outputs, or the
    arguments it writes in place or into: copy_ and out= variants do not read their destination). Views,
    allocations, 0-dim scalars and the c10d collectives count nothing."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace == "aten":
            self.total += self._moved(func, args, kwargs, out)
        return out

    @staticmethod
    def _moved(func, args, kwargs, out) -> int:
        read, written = ReadWrite._operands(func, args, kwargs, out)
        return sum(t.numel() * t.element_size() for t in read + written if t.dim() > 0)

    @staticmethod
    def _operands(func, args, kwargs, out) -> tuple[list, list]:
        """The tensors an op reads and those it writes (none for allocations and views)."""
        name = func.overloadpacket.__name__
        if name.startswith(("empty", "new_empty")):
            return [], []
        values = {a.name: v for a, v in zip(func._schema.arguments, args)} | kwargs
        written, read = [], []
        for arg in func._schema.arguments:
            tensors = [t for t in tree_flatten(values.get(arg.name))[0] if isinstance(t, torch.Tensor)]
            is_write = arg.alias_info is not None and arg.alias_info.is_write
            write_only = is_write and (arg.name == "out" or name in ("copy_", "fill_", "zero_"))
            (written if is_write else []).extend(tensors)
            (read if not write_only else []).extend(tensors)
        if not written:
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            storages = {t.untyped_storage().data_ptr() for t in read}
            if all(o.untyped_storage().data_ptr() in storages for o in outs):
                return [], []  # a view
            written = outs
        return read, written


def _measured(
    shape, vocab, batch, seq, bf16: bool, checkpointed: bool, dropout: float = 0.0, branches: int = 1
) -> int:
    """Bytes of one forward and backward of the model; `branches` 2: each block also drops out its attention's
    output, as Megatron-LM's layer does (a forward hook: torch's dropout on the output projection's)."""
    torch.manual_seed(0)
    model = TransformerLM(shape, vocab, seq, dropout)
    for block in model.layers.values():  # on a CPU, SDPA with dropout takes its math path (not counted)
        block.attention.dropout = 0.0
        if branches == 2:
            block.attention.register_forward_hook(lambda m, i, out: F.dropout(out, dropout, m.training))
    if checkpointed:  # the trainer's activation checkpointing (torch's non-reentrant checkpoint_wrapper)
        apply_ac(model.layers, "full")
    x, y = torch.randint(0, vocab, (batch, seq)), torch.randint(0, vocab, (batch, seq))
    counter = MemoryBytes()
    with counter:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(x, y)
        loss.backward()
    return counter.total


def _two_blocks(batch: int, seq: int, checkpointed: bool) -> traffic.RankWork:
    """The work of one rank running the whole 2-block model on one micro-batch."""
    blocks = 2
    return traffic.RankWork(
        tokens=batch * seq,
        blocks=blocks,
        recomputed_blocks=blocks if checkpointed else 0,
        forwards=1,
        batch=batch,
        embeddings=1.0,
        head=1.0,
    )


@pytest.mark.parametrize(
    "bf16, checkpointed",
    [(False, False), (False, True), (True, False), (True, True)],
    ids=["fp32", "fp32-checkpointed", "bf16-autocast", "bf16-autocast-checkpointed"],
)
def test_closed_form_counts_the_bytes_the_model_moves(bf16, checkpointed):
    """Whole forward + backward of a 2-block model (composite RMSNorm, the CPU's), one micro-batch."""
    shape, vocab, batch, seq = ModelShape(dim=64, n_layers=2, n_heads=4), 96, 4, 64
    measured = _measured(shape, vocab, batch, seq, bf16, checkpointed)
    k = traffic.Kernels(shape, vocab, seq, elem_bytes=2 if bf16 else 4, norm="composite")
    work = _two_blocks(batch, seq, checkpointed)
    predicted = traffic.step_bytes(k, work)
    assert predicted == pytest.approx(measured, rel=0.01), (predicted, measured)


@pytest.mark.parametrize(
    "bf16, checkpointed, branches",
    [(False, False, 1), (False, True, 1), (True, True, 1), (False, True, 2), (True, True, 2)],
    ids=[
        "fp32",
        "fp32-checkpointed",
        "bf16-autocast-checkpointed",
        "both-branches-fp32-checkpointed",
        "both-branches-bf16-autocast-checkpointed",
    ],
)
def test_closed_form_counts_the_dropout_kernels(bf16, checkpointed, branches):
    """With model.dropout > 0 the embeddings' and the MLP output's dropout kernels are counted (on the CPU
    torch's decomposition: bernoulli_, div_, x * mask, and dy * mask backward) and, under checkpointing, what
    the recomputation runs again (all but the MLP dropout's last product, whose output nothing saved). The
    bytes the dropouts add are compared, so that the rest of the step does not hide an error in them. The
    attention's own dropout is switched off here: a GPU's fused kernel drops out inside it (no bytes), while
    the CPU runs scaled_dot_product_attention's math path for it, which this count does not model. With
    `branches` 2 (Kernels.dropout_branches: Megatron-LM's layer, which also drops out the attention's output,
    mid-block, so that a checkpointed block recomputes all of it) the model is given that dropout too."""
    shape, vocab, batch, seq = ModelShape(dim=64, n_layers=2, n_heads=4), 96, 4, 64
    added = _measured(shape, vocab, batch, seq, bf16, checkpointed, 0.1, branches)
    added -= _measured(shape, vocab, batch, seq, bf16, checkpointed)
    work = _two_blocks(batch, seq, checkpointed)
    k = traffic.Kernels(shape, vocab, seq, elem_bytes=2 if bf16 else 4, norm="composite")
    with_dropout = replace(k, dropout=True, dropout_branches=branches)
    predicted = traffic.step_bytes(with_dropout, work) - traffic.step_bytes(k, work)
    assert added > 0  # the counter sees the dropout kernels
    assert predicted == added


def test_materialised_attention_adds_the_scores_and_fused_norms_move_less():
    """The two kernel choices change the count in the documented direction and by the documented amount."""
    shape = ModelShape(dim=1024, n_layers=1, n_heads=16)
    fused = traffic.Kernels(shape, 32000, 2048, elem_bytes=2)
    scores = traffic.Kernels(shape, 32000, 2048, elem_bytes=2, attention="materialised")
    extra = traffic.block_bytes(scores)["forward"] - traffic.block_bytes(fused)["forward"]
    assert extra == 2 * 2 * 16 * 2048  # read and write H x T bf16 scores per token
    # ALiBi added by baddbmm (score_bias): its copy into the scores' tensor writes H x T bf16 elements per
    # token and reads each head's bias row once, in the forward and again when recomputed
    alibi = replace(scores, score_bias=True)
    added = {
        p: traffic.block_bytes(alibi)[p] - traffic.block_bytes(scores)[p] for p in traffic.block_bytes(fused)
    }
    assert added == {"forward": 2 * 16 * (2048 + 1), "backward": 0, "recompute": 2 * 16 * (2048 + 1)}
    composite = traffic.Kernels(shape, 32000, 2048, elem_bytes=2, norm="composite")
    assert traffic.block_bytes(composite)["backward"] > traffic.block_bytes(fused)["backward"]


class ProductBytes(TorchDispatchMode):
    """Bytes read and written by the batched matrix products (bmm) dispatched under it: each operand and
    output once, whatever its strides."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in ("bmm", "baddbmm"):
            tensors = [a for a in tree_flatten((args, kwargs, out))[0] if isinstance(a, torch.Tensor)]
            self.total += sum(map(_nbytes, tensors))
        return out


def _attention_in_memory(q, k, v, alibi=None, copied=None):
    """Attention whose scores are kept in memory, as Megatron-LM's unfused path runs it: two batched
    products around the softmax (its scale and mask are memory-bound kernels, counted by block_bytes).
    With `alibi` ([b x heads, 1, s]) as BLOOM's code adds it: torch.baddbmm(alibi, q, k^T, beta=1.0), whose
    meta function first copies the broadcast bias into the result (written out here, as the CUDA and CPU
    kernels do it inside the op) and whose product then reads that result; the copy's bytes (ReadWrite's
    rules: the broadcast bias read once) are appended to `copied`."""
    b, h, t, d = q.shape
    keys = k.reshape(b * h, t, d).transpose(1, 2)
    if alibi is None:
        scores = torch.bmm(q.reshape(b * h, t, d), keys)
    else:
        result = torch.empty(b * h, t, t)
        with ReadWrite() as copy:
            result.copy_(alibi)  # common_checks_baddbmm_bmm: `if (beta != 0.0) result.copy_(self)`
        copied.append(copy.total)
        scores = torch.baddbmm(result, q.reshape(b * h, t, d), keys, beta=1.0)
    return torch.bmm(torch.softmax(scores, dim=-1), v.reshape(b * h, t, d))


@pytest.mark.parametrize("alibi", [False, True], ids=["no-bias", "alibi"])
@pytest.mark.parametrize("checkpointed", [False, True])
def test_materialised_attention_products_move_what_their_operands_hold(checkpointed, alibi):
    """The six batched products of attention with its scores in memory (two forward, four backward; two
    more when the block is recomputed) move what score_product_bytes says, counted on the real ops of
    autograd's backward. Recomputation as Megatron-LM's checkpoint runs it: the whole forward again (a
    reentrant checkpoint; torch's non-reentrant one would stop after the first product). With ALiBi added
    by baddbmm (Kernels.score_bias) each QK^T product also reads the scores' tensor it adds into, and its
    copy into that tensor writes it (traffic.alibi_bytes, counted with the ReadWrite rules: the broadcast
    bias read once); the bias has no gradient."""
    batch, heads, seq, head_dim = 2, 4, 64, 16
    q, k, v = (torch.randn(batch, heads, seq, head_dim, requires_grad=True) for _ in range(3))
    bias, copied = (torch.randn(batch * heads, 1, seq) if alibi else None), []
    with ProductBytes() as counter:
        if checkpointed:
            out = checkpoint(_attention_in_memory, q, k, v, bias, copied, use_reentrant=True)
        else:
            out = _attention_in_memory(q, k, v, bias, copied)
        out.sum().backward()
    shape = ModelShape(dim=heads * head_dim, n_layers=1, n_heads=heads)
    kernels = traffic.Kernels(shape, 512, seq, elem_bytes=4, attention="materialised", score_bias=alibi)
    runs = 2 if checkpointed else 1  # forwards of the block: the copy runs in each
    assert copied == ([batch * seq * traffic.alibi_bytes(kernels)] * runs if alibi else [])
    work = traffic.RankWork(
        tokens=batch * seq,
        blocks=1,
        recomputed_blocks=1 if checkpointed else 0,
        forwards=1,
        batch=batch,
        embeddings=0.0,
        head=0.0,
    )
    assert counter.total > 0
    assert traffic.score_product_bytes(kernels, work) == counter.total
    assert traffic.score_product_bytes(replace(kernels, attention="fused"), work) == 0  # scores on chip


def test_gpu_dropout_is_one_kernel_with_a_bool_mask_and_drops_materialised_probabilities():
    """On a GPU (fused kernels) a dropout of bf16 elements moves 2 + 2 + 1 bytes each way (native_dropout:
    x, y and a bool mask; backward: dy, the mask, dx) and a checkpointed block recomputes all of it; with
    flash attention the attention's dropout is inside the kernel, kept in memory it drops every
    probability."""
    shape = ModelShape(dim=1024, n_layers=1, n_heads=16)
    for attention, elements in (("fused", 1024), ("materialised", 1024 + 16 * 2048)):
        k = traffic.Kernels(shape, 32000, 2048, elem_bytes=2, attention=attention)
        without, with_ = traffic.block_bytes(k), traffic.block_bytes(replace(k, dropout=True))
        for part in ("forward", "backward", "recompute"):
            assert with_[part] - without[part] == 5 * elements, (attention, part)


class _OutsideNorms(MemoryBytes):
    """MemoryBytes paused while an RMSNorm runs its own forward or backward kernels (module hooks)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.counting = True
        for norm in (m for m in model.modules() if isinstance(m, torch.nn.RMSNorm)):
            norm.register_forward_pre_hook(lambda *_: setattr(self, "counting", False))
            norm.register_forward_hook(lambda *_: setattr(self, "counting", True))
            norm.register_full_backward_pre_hook(lambda *_: setattr(self, "counting", False))
            norm.register_full_backward_hook(lambda *_: setattr(self, "counting", True))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.counting:
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


@pytest.mark.parametrize(
    "checkpointed, dropout",
    [(False, 0.0), (True, 0.0), (False, 0.1), (True, 0.1)],
    ids=["plain", "checkpointed", "dropout", "dropout-checkpointed"],
)
def test_a_16_bit_module_casts_nothing_but_the_logits(checkpointed, dropout):
    """A code that runs its whole module in 16 bits without autocast (Kernels.module_16bit: Megatron-LM's
    Float16Module, DeepSpeed's bf16 engine), as the real model converted to bf16 and run without autocast on
    the CPU: every memory-bound op outside the norms is counted as the dispatch counter measures it (no
    activation or weight casts, the gradients summed in 16 bits, the logits alone cast to fp32 for the loss,
    the 16-bit embeddings). The norms' own kernels are left out of both sides: the counter pauses inside each
    RMSNorm's forward and backward, and the closed form's norm_bytes are subtracted (2 per block and the
    final one; checkpointing recomputes the blocks' forwards). Such codes run a fused 16-bit norm kernel
    (apex's), counted from its arguments, where the CPU runs torch's upcasting decomposition."""
    shape, vocab, batch, seq = ModelShape(dim=64, n_layers=2, n_heads=4), 96, 4, 64
    torch.manual_seed(0)
    model = TransformerLM(shape, vocab, seq, dropout).to(torch.bfloat16)
    for block in model.layers.values():  # as above: the attention's own dropout is not modelled on a CPU
        block.attention.dropout = 0.0
    counter = _OutsideNorms(model)
    if checkpointed:
        apply_ac(model.layers, "full")
    x, y = torch.randint(0, vocab, (batch, seq)), torch.randint(0, vocab, (batch, seq))
    with counter:
        model(x, y).backward()
    k = traffic.Kernels(
        shape,
        vocab,
        seq,
        elem_bytes=2,
        param_bytes=2,
        norm="composite",
        module_16bit=True,
        dropout=dropout > 0,
    )
    norm = traffic.norm_bytes(k)
    norms = 2 * shape.n_layers + 1
    recomputed = 2 * shape.n_layers if checkpointed else 0
    tokens = batch * seq
    without_norms = traffic.step_bytes(k, _two_blocks(batch, seq, checkpointed))
    without_norms -= tokens * (norms * (norm["forward"] + norm["backward"]) + recomputed * norm["forward"])
    assert counter.total > 0
    assert without_norms == pytest.approx(counter.total, rel=0.01), (without_norms, counter.total)
    # and the same step under autocast with bf16 parameters moves more: its casts and fp32 norms
    autocast = replace(k, module_16bit=False)
    assert traffic.step_bytes(autocast, _two_blocks(batch, seq, checkpointed)) > traffic.step_bytes(
        k, _two_blocks(batch, seq, checkpointed)
    )


def _micro_batch_bytes(model, vocab, batch, seq, micro_batches: int, bf16: bool = False) -> list[int]:
    """Bytes each of `micro_batches` forward and backward passes moves (MemoryBytes), the gradients
    accumulating across them as in one step (no optimizer step in between)."""
    torch.manual_seed(1)
    x, y = torch.randint(0, vocab, (batch, seq)), torch.randint(0, vocab, (batch, seq))
    moved = []
    for _ in range(micro_batches):
        counter = MemoryBytes()
        with counter:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(x, y)
            loss.backward()
        moved.append(counter.total)
    return moved


def _whole_model(batch: int, seq: int, forwards: int) -> traffic.RankWork:
    return replace(_two_blocks(batch, seq, False), forwards=forwards)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_each_later_micro_batch_adds_its_gradients_into_the_accumulated_ones(bf16):
    """Gradient accumulation as exatrain's trainer runs it without FSDP (DDP under no_sync, TP, pipeline
    microbatches): from the second micro-batch on, autograd adds each fp32 weight gradient into .grad in
    place, which the counter sees as the later micro-batches moving more than the first; the closed form's
    increments (accumulation_bytes over 1, 2 and 3 micro-batches) are those differences, and its gradient
    elements are the model's parameters."""
    shape, vocab, batch, seq = ModelShape(dim=64, n_layers=2, n_heads=4), 96, 4, 64
    torch.manual_seed(0)
    model = TransformerLM(shape, vocab, seq, 0.0)
    first, second, third = _micro_batch_bytes(model, vocab, batch, seq, 3, bf16)
    k = traffic.Kernels(shape, vocab, seq, elem_bytes=2 if bf16 else 4, norm="composite")
    acc = [traffic.accumulation_bytes(k, _whole_model(batch, seq, f)) for f in (1, 2, 3)]
    assert traffic.gradient_elements(k, _whole_model(batch, seq, 1)) == sum(
        p.numel() for p in model.parameters()
    )
    assert acc[0] == 0
    assert second - first == acc[1] - acc[0] > 0  # the second micro-batch's adds
    assert third - first == acc[2] - acc[1]  # and the third's, as many
    # a code whose accumulation is not modelled is not charged
    assert traffic.accumulation_bytes(replace(k, accumulation="none"), _whole_model(batch, seq, 3)) == 0


@pytest.mark.parametrize("param_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16-params"])
def test_fsdp_accumulates_unsharded_gradients_in_fp32(tmp_path, param_dtype):
    """FSDP2 (fully_shard per block and on the root, fp32 reduce dtype, as exatrain's FSDP) with the
    gradient sync off for the earlier micro-batches (exatrain's trainer: set_requires_gradient_sync(False))
    on a one-rank gloo group: with fp32 parameters each later micro-batch adds its gradients in place (12
    bytes per element); with bf16 parameters the first converts its bf16 gradient into an fp32 accumulator
    (read 2, write 4) and each later one adds into it (read 4 and 2, write 4). The counter sees the
    difference of the two (second micro-batch minus the first: 12 or 10 - 6 = 4 bytes per element) and the
    same bytes for every later micro-batch; the closed form's increments give the same."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    shape, vocab, batch, seq = ModelShape(dim=64, n_layers=2, n_heads=4), 96, 4, 64
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = TransformerLM(shape, vocab, seq, 0.0)
        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        for block in model.layers.values():
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        model.set_requires_gradient_sync(False)
        first, second, third = _micro_batch_bytes(model, vocab, batch, seq, 3)
    finally:
        dist.destroy_process_group()
    k = traffic.Kernels(
        shape,
        vocab,
        seq,
        elem_bytes=4,
        param_bytes=2 if param_dtype == torch.bfloat16 else 4,
        norm="composite",
    )
    acc = [traffic.accumulation_bytes(k, _whole_model(batch, seq, f)) for f in (1, 2, 3, 4)]
    add = acc[3] - acc[2]  # what each later micro-batch adds
    convert = acc[2] - 2 * add  # what the first one moves for the accumulator
    assert acc[0] == 0 and add == acc[2] - acc[1]
    assert second - first == add - convert
    assert third == second


def test_fsdp1_divides_as_torch_and_its_units_are_the_blocks_and_the_root():
    """The `fsdp1` accumulation (published codes on torch's FSDP1; its bytes per unit are counted on real
    FSDP1 ranks in tests/distributed/test_plan_fsdp1_traffic.py): the pre- and post-division factors are
    torch's own for every data-parallel size from 1 to 4096, and a rank's bytes are those of its block units
    (gathered twice per micro-batch) plus its root unit (embeddings, final norm, head; gathered once), whose
    elements are the real model's parameters outside and inside the blocks."""
    from torch.distributed.algorithms._comm_hooks.default_hooks import DefaultState

    for n in range(1, 4097):
        pre, post = traffic.fsdp1_divisors(n)
        assert pre == DefaultState._get_gradient_predivide_factor(n) and post == n / pre, n
    shape, vocab, batch, seq = ModelShape(dim=64, n_layers=2, n_heads=4), 96, 4, 64
    model = TransformerLM(shape, vocab, seq, 0.0)
    in_blocks = sum(p.numel() for p in model.layers.parameters())
    root = sum(p.numel() for p in model.parameters()) - in_blocks
    k = traffic.Kernels(shape, vocab, seq, elem_bytes=2, param_bytes=2, accumulation="fsdp1")
    k = replace(k, shard=8, data_parallel=8)
    w = _whole_model(batch, seq, 3)
    assert traffic.root_elements(k, w) == root
    expected = traffic.fsdp1_gradient_bytes(in_blocks, in_blocks / 8, 3, 2, 8) + traffic.fsdp1_gradient_bytes(
        root, root / 8, 3, 2, 8, unshards=1
    )
    assert traffic.accumulation_bytes(k, w) == expected > 0
