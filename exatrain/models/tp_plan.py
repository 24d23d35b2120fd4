"""Tensor-parallel plans of the reference model (`exatrain.models.transformer`), next to the model.

A plan maps module names (relative to the module it is applied to) to torch ParallelStyles; the
model-agnostic `exatrain.distributed.parallelize.apply_tp` applies it. Megatron-style split of a block:

    attention: wq, wk, wv column-wise (each rank computes H/tp heads), wo row-wise (partial sums reduced)
    ffn:       w1 column-wise (hidden/tp units), w2 row-wise

so a block needs one reduction in forward per sub-layer and the activations between the two linears
stay sharded. Embeddings are split by rows (vocabulary / positions); the output head column-wise, with
its logits gathered (Replicate) or, for loss parallel, left sharded along the vocabulary (Shard(-1)).

Sequence parallel additionally keeps the residual stream sharded along the sequence (Shard(1)) between
the sub-layers: norms run on sequence shards, and the all-reduce after wo/w2 becomes a reduce-scatter
(plus an all-gather before wq/w1): the same traffic, 1/tp of the activation memory.
"""

from __future__ import annotations

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)


def block_tp_plan(sequence_parallel: bool) -> dict:
    """The plan of one `Block` (names relative to the block)."""
    # with sequence parallel the residual stream between sub-layers is sharded along T (dim 1)
    residual = Shard(1) if sequence_parallel else Replicate()
    plan = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=residual),
        "ffn.w1": ColwiseParallel(),
        "ffn.w2": RowwiseParallel(output_layouts=residual),
    }
    if sequence_parallel:
        # norms work on sequence shards; attention and MLP gather the full sequence first
        gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        plan.update(
            {
                "attention_norm": SequenceParallel(),
                "attention": gather,
                "ffn_norm": SequenceParallel(),
                "ffn": gather,
            }
        )
    return plan


def outer_tp_plan(sequence_parallel: bool, loss_parallel: bool) -> dict:
    """The plan of the parts of `TransformerLM` outside the blocks (embeddings, final norm, output).

    Entries name only the modules present, so a pipeline stage without embeddings or output can apply
    the plan filtered to its own modules (`exatrain.distributed.parallelize.apply_tp` drops the absent ones).
    """
    residual = Shard(1) if sequence_parallel else Replicate()
    plan = {
        # rows of the table split across ranks; each rank looks up its rows, partial sums are reduced
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=residual),
        # positions (T,) -> (T, D): with sequence parallel, sharded along T (dim 0) to add onto (B, T/tp, D)
        "pos_embeddings": RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(0) if sequence_parallel else Replicate()
        ),
        "output": ColwiseParallel(
            input_layouts=residual,
            # loss parallel: keep logits sharded along the vocabulary; cross_entropy under
            # torch's loss_parallel() context reduces across ranks without gathering (B, T, V)
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        ),
    }
    if sequence_parallel:
        plan["norm"] = SequenceParallel()
    return plan


def tp_plan(block_names, sequence_parallel: bool = False, loss_parallel: bool = False) -> dict:
    """The whole plan for a `TransformerLM` (or a pipeline stage of it) holding the blocks named
    `block_names` (keys of `model.layers`); `apply_tp` skips entries for modules a stage lacks."""
    plan = outer_tp_plan(sequence_parallel, loss_parallel)
    for name in block_names:
        plan.update(
            {f"layers.{name}.{path}": style for path, style in block_tp_plan(sequence_parallel).items()}
        )
    return plan
