"""The `fsdp1` gradient path of the step-time model (exatrain.tools.plan.traffic.fsdp1_gradient_bytes: what
torch's FullyShardedDataParallel, FSDP1, moves per step besides the products and the collectives, as the
MPT runs of docs/plan-validation.md ran it under Composer) against REAL FSDP1 ranks on gloo.

Each rank wraps exatrain's reference model as Composer wraps MPT: one FSDP1 unit per block and the root
(embeddings, final norm, head), FULL_SHARD, MixedPrecision(param_dtype=bf16) under bf16 autocast, and (in
one case) activation checkpointing applied inside the units after wrapping. It runs 3 micro-batches of
one step (forward and backward, no optimizer step; FSDP1 reduce-scatters each). A TorchDispatchMode counts
the bytes of every op that writes a one-dimensional tensor of a flat parameter's size (unsharded or
shard): the flat gradient, its divisions, casts and accumulation, the parameter shards' casts. The
collectives themselves are not counted (they are the communication term): the counter pauses inside the
all-gathers and reduce-scatters (all_gather_single / reduce_scatter_single in torch 2.13, *_tensor
before), inside which gloo copies its result (split + copy_, which NCCL does not). Per rank the count must
EQUAL the closed form, summed over the units with their real (padded) sizes: at W = 2 (pre-division by 2,
none after) and at W = 4 with activation checkpointing (2 before, 2 after; the recompute gathers nothing
more).

Not reproduced: NCCL's in-place collectives; CUDA streams (the bytes are the same, their overlap is not
measured here); the FSDP1 of torch 2.1 that the MPT runs used: its gradient path was read in the code
before it (pytorch/pytorch at 00ae0bc, the version stored where this was written: the same cast of the
shard and accumulation, the default communication hook pre- and post-dividing around the reduce-scatter)
and is the one run here in torch 2.13.
"""

import json
import os

import pytest
import torch
from torch.utils._pytree import tree_flatten

from exatrain.models.sizes import ModelShape
from exatrain.models.transformer import Block, TransformerLM
from exatrain.tools.plan import traffic
from tests.distributed.helpers import spawn

pytestmark = pytest.mark.dist

COLLECTIVES = (
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_gather_single",
    "reduce_scatter_single",
)
SHAPE, VOCAB, SEQ, BATCH, MICRO_BATCHES = ModelShape(dim=64, n_layers=2, n_heads=4), 96, 32, 2, 3


class FlatParamBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Bytes read and written by the ops that write a one-dimensional tensor of a flat parameter's size
    (its output, or the input it writes in place); views and allocations move nothing, copy_ reads only its
    source."""

    def __init__(self, sizes: set[int]):
        super().__init__()
        self.sizes, self.total, self.paused = sizes, 0, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.paused:
            self.total += self._moved(func, args, kwargs or {}, out)
        return out

    def _moved(self, func, args, kwargs, out) -> int:
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        inplace = any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)
        written = ins[:1] if inplace else outs
        if not any(t.dim() == 1 and t.numel() in self.sizes for t in written):
            return 0
        storages = {t.untyped_storage().data_ptr() for t in ins}
        name = func.overloadpacket.__name__
        if name.startswith(("empty", "new_empty")) or (
            not inplace and all(o.untyped_storage().data_ptr() in storages for o in outs)
        ):
            return 0  # an allocation or a view
        nbytes = [t.numel() * t.element_size() for t in ins]
        if name == "copy_":  # writes its destination, reads its source
            return sum(nbytes)
        return sum(nbytes) + sum(t.numel() * t.element_size() for t in outs)


def _paused(counter: FlatParamBytes, collective):
    def call(*args, **kwargs):
        counter.paused = True
        try:
            return collective(*args, **kwargs)
        finally:
            counter.paused = False

    return call


def composer_fsdp1():
    """exatrain's reference model wrapped in FSDP1 as Composer wraps MPT: one unit per block and the root,
    FULL_SHARD, bf16 parameters (a rank of an initialised gloo group)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    torch.manual_seed(0)
    return FSDP(
        TransformerLM(SHAPE, VOCAB, SEQ, 0.0),
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16),
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        device_id=torch.device("cpu"),
    )


def _rank(rank, world, env, checkpointed, out_dir):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    dist = torch.distributed
    dist.init_process_group(
        "gloo", init_method=f"tcp://{env.main_address}:{env.main_port}", rank=rank, world_size=world
    )
    try:
        model = composer_fsdp1()
        if checkpointed:
            apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))
        units = [(m._handle.flat_param, m is model) for m in FSDP.fsdp_modules(model)]
        # the unsharded flat parameter is padded to `world` equal shards
        sizes = [(fp._sharded_size.numel() * world, fp._sharded_size.numel(), root) for fp, root in units]
        counter = FlatParamBytes({n for s in sizes for n in s[:2]})
        # FSDP1 calls these by their module attribute (torch 2.13: the *_single names)
        original = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}
        for name, collective in original.items():
            setattr(dist, name, _paused(counter, collective))
        x, y = torch.randint(0, VOCAB, (BATCH, SEQ)), torch.randint(0, VOCAB, (BATCH, SEQ))
        try:
            with counter:
                for _ in range(MICRO_BATCHES):
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        loss = model(x, y)
                    loss.backward()
        finally:
            for name, collective in original.items():
                setattr(dist, name, collective)
        with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
            json.dump({"measured": counter.total, "units": sizes}, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world, checkpointed", [(2, False), (4, True)], ids=["w2", "w4-checkpointed"])
def test_fsdp1_gradient_path_moves_what_the_closed_form_counts(tmp_path, world, checkpointed):
    spawn(_rank, world, checkpointed, str(tmp_path))
    for rank in range(world):
        result = json.loads((tmp_path / f"{rank}.json").read_text())
        expected = sum(
            traffic.fsdp1_gradient_bytes(full, shard, MICRO_BATCHES, 2, world, unshards=1 if root else 2)
            for full, shard, root in result["units"]
        )
        assert result["measured"] == expected, (rank, result)
    # the units are the blocks and the root, and their elements the model's (padding aside)
    assert len(result["units"]) == SHAPE.n_layers + 1
