"""DeepSpeed's BF16_Optimizer step in the step-time model (estimate.optimizer_step_bytes and the all-gather
analytic.collectives adds after it, `optimizer = "deepspeed-bf16"`: the code of BLOOM and of the LUMI runs
of docs/plan-validation.md) against REAL DeepSpeed ranks on gloo (DeepSpeed's CPU accelerator).

Each rank wraps exatrain's reference model in DeepSpeed's engine with bf16 parameters, fp32 gradient
accumulation and ZeRO stage 1, the configuration under which DeepSpeed builds its BF16_Optimizer (BLOOM's
and the LUMI runs' DeepSpeed built it for bf16 at stage 0: the same optimizer), runs one step and a second
forward and backward, and then the optimizer's step alone. A TorchDispatchMode counts the bytes every aten
op of that step reads and writes, a second one those of the base optimizer's own update inside it (an
AdamW here, a fused Adam on GPUs; the model charges ADAMW_BYTES_PER_ELEMENT for it); the difference is what
BF16_Optimizer adds around the update. Between two model widths with the same tensors (dim 64 and 128) it
must grow by EXACTLY what the closed form adds, at W = 2 and 4: every fp32 gradient read for the norm and
zeroed after the step, the rank's partition copied to bf16. (At one width the count also holds the norm's
per-tensor scalars, a few bytes per tensor, which the model leaves out and the difference cancels.) The
collectives of that step must be the one all-gather the model adds, of S = every parameter element in bf16.

Not reproduced: NCCL and CUDA (gloo and CPU kernels run the same ops), the base optimizer's own bytes (a CPU
AdamW runs unfused ops), the bucketed all-gathers of DeepSpeed releases without all_gather_into_tensor
(the same bytes in more calls), and Megatron-DeepSpeed's two parameter groups (two calls, the same bytes).
"""

import json
import os
from pathlib import Path

import pytest
import torch

from exatrain.engines.deepspeed.setup import _init_distributed, import_deepspeed
from exatrain.models.sizes import ModelShape
from exatrain.models.transformer import TransformerLM
from exatrain.tools.plan import estimate
from exatrain.tools.plan.comm import CollectiveRecorder
from tests.distributed.helpers import spawn
from tests.unit.test_plan_traffic import ReadWrite

pytestmark = pytest.mark.dist

SHAPES = (ModelShape(dim=64, n_layers=2, n_heads=4), ModelShape(dim=128, n_layers=2, n_heads=4))
VOCAB, SEQ, BATCH = 96, 32, 2
CONFIG = {
    "train_micro_batch_size_per_gpu": BATCH,
    "gradient_accumulation_steps": 1,
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 1},
    "data_types": {"grad_accum_dtype": "fp32"},
    "gradient_clipping": 0.0,
}


def _counted(step):
    """`step` run under a byte counter: (its result, the bytes its aten ops moved)."""
    with ReadWrite() as counter:
        out = step()
    return out, counter.total


def _step(deepspeed, shape: ModelShape) -> dict:
    """One BF16_Optimizer step of the model of `shape`, counted: its kind, the bytes it moves around the base
    optimizer's update, the model's parameter elements, and its gathers (kind, group size, S)."""
    torch.manual_seed(0)
    model = TransformerLM(shape, VOCAB, SEQ, 0.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=CONFIG)
    x, y = torch.randint(0, VOCAB, (BATCH, SEQ)), torch.randint(0, VOCAB, (BATCH, SEQ))
    engine.backward(engine(x, y))
    engine.step()  # the first step builds the optimizer's state
    engine.backward(engine(x, y))
    base = engine.optimizer.optimizer
    inner = {}
    update = base.step

    def counted_update(*args, **kwargs):
        out, inner["bytes"] = _counted(lambda: update(*args, **kwargs))
        return out

    base.step = counted_update
    with CollectiveRecorder() as recorder:
        _, total = _counted(engine.optimizer.step)
    return {
        "kind": type(engine.optimizer).__name__,
        "added": total - inner["bytes"],
        "elements": sum(p.numel() for p in model.parameters()),
        "gathers": [(k, len(ranks), s) for k, ranks, s in recorder.calls if "gather" in k],
    }


def _rank(rank, world, env, out_dir):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    dist = torch.distributed
    dist.init_process_group(
        "gloo", init_method=f"tcp://{env.main_address}:{env.main_port}", rank=rank, world_size=world
    )
    try:
        deepspeed = import_deepspeed("cpu")
        _init_distributed(deepspeed, "gloo")  # DeepSpeed on this group, without building its CPU shm op
        results = [_step(deepspeed, shape) for shape in SHAPES]
        with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
            json.dump(results, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_bf16_optimizer_step_moves_and_gathers_what_the_model_counts(tmp_path, world):
    spawn(_rank, world, str(tmp_path))
    for rank in range(world):
        small, large = json.loads((tmp_path / f"{rank}.json").read_text())
        closed = []
        for result in (small, large):
            assert result["kind"] == "BF16_Optimizer", result
            elements = result["elements"]
            assert elements % (2 * world) == 0  # no alignment padding in DeepSpeed's flat buffers
            around_update = estimate.optimizer_step_bytes("deepspeed-bf16", elements, world)
            closed.append(around_update - elements // world * estimate.ADAMW_BYTES_PER_ELEMENT)
            # one all-gather over the data-parallel ranks, S = every parameter element in bf16
            assert [tuple(g) for g in result["gathers"]] == [("all_gather", world, elements * 2)], result
        assert large["added"] - small["added"] == closed[1] - closed[0], (rank, small, large, closed)


def test_the_planning_page_quotes_the_bf16_optimizers_bytes():
    """docs/planning.md's optimizer term gives BF16_Optimizer's bytes as the model counts them."""
    planning = " ".join((Path(__file__).resolve().parents[2] / "docs/planning.md").read_text().split())
    per_partition = estimate.OPTIMIZER_BYTES["deepspeed-bf16"]
    per_gradient = estimate.GRADIENT_BYTES["deepspeed-bf16"]
    stated = (
        f"{per_partition} bytes per element of the rank's 1/DP partition, which alone it updates and copies"
    )
    stated += f" to bf16, and {per_gradient} per gradient element for the norm and the zeroing"
    assert stated in planning, stated
