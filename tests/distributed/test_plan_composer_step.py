"""The optimizer step of the MPT runs' code in the step-time model (`optimizer = "composer-adamw"` for the
MPT rows of docs/plan-validation.md: estimate.OPTIMIZER_BYTES) against REAL FSDP1 ranks on gloo.

Each rank wraps exatrain's reference model as Composer wraps MPT (one FSDP1 unit per block and the root,
FULL_SHARD, bf16 parameters under bf16 autocast), runs a forward and backward, a first step (which creates the
optimizer's moments), and a second forward and backward. Then, under a counter of every aten op's reads and
writes, the step as Composer runs it with the MPT yamls' settings: its GradientClipping calls the root FSDP1
module's own clip_grad_norm_(1.0) (torch's, run here for real), and its DecoupledAdamW updates every flat
parameter shard with weight decay 0. The bytes must EQUAL the closed form, shard elements x 92, at W = 2 and
4, up to the norm's per-unit scalars (a few bytes per unit).

Not reproduced: Composer itself. DecoupledAdamW.adamw's ops are written below as read in
mosaicml/composer's composer/optim/decoupled_weight_decay.py (at 02c872e; the loop has not changed since
2022), and Composer's clipping call as read in composer/algorithms/gradient_clipping/gradient_clipping.py (at
13dd358). CUDA kernels: a kernel that reads one tensor twice (addcmul_(grad, grad)) loads it once from
memory, its second load hitting its cache, and the counter counts it once; the CPU's kernels are not timed.
The FSDP1 of torch 2.1 that the runs used: its clip_grad_norm_ (norm of every gradient, then an unconditional
multiply by the clamped coefficient, "to avoid the host-device sync") is the one run here in torch 2.13.
"""

import json
import math
import os
from pathlib import Path

import pytest
import torch

from exatrain.tools.plan import estimate
from tests.distributed.helpers import spawn
from tests.distributed.test_plan_fsdp1_traffic import BATCH, SEQ, SHAPE, VOCAB, composer_fsdp1
from tests.unit.test_plan_traffic import ReadWrite

pytestmark = pytest.mark.dist

LR, BETAS, EPS = 2.0e-4, (0.9, 0.95), 1.0e-8  # mpt-1b.yaml's optimizer


class DistinctReadWrite(ReadWrite):
    """ReadWrite, with a tensor an op reads through two arguments counted once."""

    @staticmethod
    def _moved(func, args, kwargs, out) -> int:
        read, written = ReadWrite._operands(func, args, kwargs, out)
        distinct = {(t.data_ptr(), t.numel(), t.dtype): t for t in read}.values()
        return sum(t.numel() * t.element_size() for t in [*distinct, *written] if t.dim() > 0)


@torch.no_grad()
def decoupled_adamw(params, state: dict) -> None:
    """Composer's DecoupledAdamW step with weight decay 0: per parameter, the moments' updates in place, a
    new denominator, and the parameter's update, each a separate op (no fused or foreach kernel)."""
    beta1, beta2 = BETAS
    for p in params:
        s = state.setdefault(p, {})
        if not s:
            s.update(step=torch.zeros(()), m=torch.zeros_like(p), v=torch.zeros_like(p))
        s["step"] += 1
        step = s["step"].item()
        s["m"].mul_(beta1).add_(p.grad, alpha=1 - beta1)
        s["v"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
        denom = (s["v"].sqrt() / math.sqrt(1 - beta2**step)).add_(EPS)
        p.addcdiv_(s["m"], denom, value=-LR / (1 - beta1**step))


def _rank(rank, world, env, out_dir):
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://{env.main_address}:{env.main_port}", rank=rank, world_size=world
    )
    try:
        model = composer_fsdp1()
        params, state = list(model.parameters()), {}
        x, y = torch.randint(0, VOCAB, (BATCH, SEQ)), torch.randint(0, VOCAB, (BATCH, SEQ))
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                model(x, y).backward()
            with DistinctReadWrite() as counter:  # the second step's count is kept
                model.clip_grad_norm_(max_norm=1.0)
                decoupled_adamw(params, state)
            grads = sorted({str(p.grad.dtype) for p in params})
            model.zero_grad(set_to_none=True)
        shards = [p.numel() for p in params]
        with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
            dtypes = sorted({str(p.dtype) for p in params})
            json.dump({"measured": counter.total, "shards": shards, "dtypes": dtypes, "grads": grads}, f)
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_composer_step_moves_what_the_closed_form_counts(tmp_path, world):
    spawn(_rank, world, str(tmp_path))
    for rank in range(world):
        result = json.loads((tmp_path / f"{rank}.json").read_text())
        # the optimizer steps the fp32 flat parameter shards, one per FSDP1 unit (the blocks and the root)
        assert result["dtypes"] == result["grads"] == ["torch.float32"]
        assert len(result["shards"]) == SHAPE.n_layers + 1
        expected = sum(result["shards"]) * estimate.OPTIMIZER_BYTES["composer-adamw"]
        units = len(result["shards"])
        assert expected <= result["measured"] <= expected + 16 * units, (rank, result, expected)
    # the planning page quotes the step's bytes
    planning = " ".join((Path(__file__).resolve().parents[2] / "docs/planning.md").read_text().split())
    assert f"`clip_grad_norm_` (the MPT runs') {estimate.OPTIMIZER_BYTES['composer-adamw']};" in planning
