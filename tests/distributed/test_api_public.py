"""docs/api.md's two-rank example of `exatrain.Pipeline` (with `exatrain.clip_grad_norm_` across the stages
and `pipe.full_state_dict`), run as written on 2 real gloo ranks, against the same model trained in this
process.

Two stages, one per rank, 4 pipeline microbatches of one batch of 16: the mean of the microbatch losses and
the gradients summed with the pipeline's 1/4 scale are those of the whole batch, so every step's loss and
gradient norm must equal one process's (fp32; only summation order differs: 1e-5). Both ranks must print
the same norm: each stage alone has a different one, so equal norms mean the stages' norms were combined.
"""

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.distributed.api_runs import run_ranks

pytestmark = pytest.mark.dist

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
LINE = re.compile(r"^step (\d+) loss (\S+) norm (\S+)$", re.M)
TOL = 1e-5


def _pipeline_example() -> str:
    blocks = [
        b
        for b in re.findall(r"```py\n(.*?)```", DOC.read_text(), flags=re.S)
        if b.startswith("# pipeline.py")
    ]
    assert len(blocks) == 1, "docs/api.md has one pipeline example starting with '# pipeline.py'"
    return blocks[0]


def _one_process(steps: int) -> list[tuple[int, float, float]]:
    """The example's model, data, clipping and SGD in this process, without pipelining."""
    torch.manual_seed(0)  # what exatrain.init(seed=0) does on every rank before the model is built
    full = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(full.parameters(), lr=0.05)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    y = x.sum(1, keepdim=True)
    out = []
    for step in range(steps):
        loss = nn.functional.mse_loss(full(x), y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(full.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        out.append((step, loss.item(), norm.item()))
    return out


def test_pipeline_example_matches_one_process(tmp_path):
    script = tmp_path / "pipeline.py"
    script.write_text(_pipeline_example())
    run_ranks(script, [], 2, tmp_path / "logs")
    logs = [(tmp_path / "logs" / f"rank-{r}.log").read_text() for r in range(2)]
    ranks = [[(int(s), float(loss), float(norm)) for s, loss, norm in LINE.findall(log)] for log in logs]
    assert ranks[0] == ranks[1] and len(ranks[0]) == 3, logs  # loss from the last stage, norm of both stages
    for (step, loss, norm), (_, ref_loss, ref_norm) in zip(ranks[0], _one_process(3)):
        assert abs(loss - ref_loss) <= TOL and abs(norm - ref_norm) <= TOL, (
            step,
            loss,
            ref_loss,
            norm,
            ref_norm,
        )
    whole = "whole model: ['0.bias', '0.weight', '2.bias', '2.weight', '4.bias', '4.weight']"
    assert whole in logs[0] and "whole model" not in logs[1]
