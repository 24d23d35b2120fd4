"""torch DDP's bucket copies in the step-time model (exatrain.tools.plan.traffic.ddp_bytes: what torch's
DistributedDataParallel moves per step besides the all-reduce, with gradient_as_bucket_view off as
exatrain's trainer and Megatron-LM's DDP=torch leave it) against REAL DDP ranks on gloo.

Each rank runs the same two micro-batches (the first under no_sync, as gradient accumulation runs them) on
exatrain's reference model twice: wrapped in DistributedDataParallel with its defaults, and bare (autograd
accumulating the same gradients, no reduction). A TorchDispatchMode counts the bytes every aten op reads
and writes (scalars and the c10d collectives themselves aside: they are the communication term); the
difference between the two runs is what DDP adds. Per rank it must EQUAL the closed form at W = 2 and 3,
in fp32 (exatrain) and with fp16 parameters (Megatron-LM's Float16Module): the reducer copies each
gradient into its bucket dividing by the ranks (mul_out) and the reduced bucket back (copy_), once.

Not reproduced: NCCL (gloo's all-reduce on the CPU; the reducer's copies are the same ops on either), and
CUDA streams (the bytes, not their overlap with the backward, are checked here).
"""

import contextlib
import copy
import dataclasses
import json
import os

import pytest
import torch

from exatrain.models.sizes import ModelShape
from exatrain.models.transformer import TransformerLM
from exatrain.tools.plan import traffic
from tests.distributed.helpers import spawn
from tests.unit.test_plan_traffic import ReadWrite

pytestmark = pytest.mark.dist

SHAPE, VOCAB, SEQ, BATCH, MICRO_BATCHES = ModelShape(dim=64, n_layers=2, n_heads=4), 96, 32, 2, 2


def _step(model, ddp: bool, x, y) -> int:
    """Bytes of one step of MICRO_BATCHES micro-batches (forward and backward; DDP synchronises the last)."""
    with ReadWrite() as counter:
        for i in range(MICRO_BATCHES):
            last = i == MICRO_BATCHES - 1
            with model.no_sync() if ddp and not last else contextlib.nullcontext():
                model(x, y).backward()
    return counter.total


def _rank(rank, world, env, dtype, out_dir):
    from torch.nn.parallel import DistributedDataParallel

    dist = torch.distributed
    dist.init_process_group(
        "gloo", init_method=f"tcp://{env.main_address}:{env.main_port}", rank=rank, world_size=world
    )
    try:
        torch.manual_seed(0)
        bare = TransformerLM(SHAPE, VOCAB, SEQ, 0.0).to(getattr(torch, dtype))
        wrapped = DistributedDataParallel(copy.deepcopy(bare))
        x, y = torch.randint(0, VOCAB, (BATCH, SEQ)), torch.randint(0, VOCAB, (BATCH, SEQ))
        with_ddp, without = _step(wrapped, True, x, y), _step(bare, False, x, y)
        elements = sum(p.numel() for p in bare.parameters())
        with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
            json.dump({"added": with_ddp - without, "elements": elements}, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world, dtype", [(2, "float32"), (3, "float16")])
def test_ddp_bucket_copies_move_what_the_closed_form_counts(tmp_path, world, dtype):
    spawn(_rank, world, dtype, str(tmp_path))
    param_bytes = 4 if dtype == "float32" else 2
    k = traffic.Kernels(SHAPE, VOCAB, SEQ, elem_bytes=param_bytes, param_bytes=param_bytes, ddp=True)
    w = traffic.RankWork(
        tokens=MICRO_BATCHES * BATCH * SEQ,
        blocks=SHAPE.n_layers,
        recomputed_blocks=0,
        forwards=MICRO_BATCHES,
        batch=BATCH,
        embeddings=1,
        head=1,
    )
    for rank in range(world):
        result = json.loads((tmp_path / f"{rank}.json").read_text())
        assert result["elements"] == traffic.gradient_elements(k, w)  # the closed form's gradients
        assert result["added"] == traffic.ddp_bytes(k, w), (rank, result)
    assert traffic.ddp_bytes(dataclasses.replace(k, ddp=False), w) == 0
