"""`exatrain plan`'s parameter + gradient + optimizer bytes per rank against REAL gloo ranks.

The plan builds the layout on the meta device under a fake process group; here the same layouts run on 2
and 4 real ranks (FSDP and DDP), take one AdamW step, and sum the local shard bytes each rank holds.
"""

import json

import pytest
import torch

from exatrain.config import load_config
from exatrain.dist import init_distributed, teardown
from exatrain.dist.parallel_dims import ParallelDims
from exatrain.models.transformer import build_model
from exatrain.train.optim import build_optimizer
from exatrain.train.plan import make_plan
from exatrain.train.plan.layout import apply_layout, local_state_bytes
from tests.dist.helpers import spawn

pytestmark = pytest.mark.dist

VOCAB, SEQ = 512, 32
BASE = ["--model.size=small", f"--data.seq_len={SEQ}", "--train.micro_batch_size=2", "--train.global_batch_size=8"]
LAYOUTS = {  # name -> overrides; the world size comes from the test
    "fsdp": ["--parallel.dp_replicate=1", "--parallel.dp_shard=-1"],
    "ddp": ["--parallel.dp_replicate=-1", "--parallel.dp_shard=1"],
}


def _config(layout: str):
    return load_config(None, BASE + LAYOUTS[layout])


def _wrap(model, dims, cfg):
    """The layout as training applies it: DDP for plain replication, else TP/FSDP."""
    if dims.ddp:
        return torch.nn.parallel.DistributedDataParallel(model)
    apply_layout(model, dims, cfg)
    return model


def _worker(rank, world, env, out):
    init_distributed(env, "cpu", timeout_s=120)
    torch.set_num_threads(1)
    result = {}
    for layout in LAYOUTS:
        cfg = _config(layout)
        dims = ParallelDims.from_config(cfg.parallel, world)
        dims.build_mesh("cpu")
        torch.manual_seed(0)
        model = build_model("small", VOCAB, SEQ)
        wrapped = _wrap(model, dims, cfg)
        opt = build_optimizer(model, cfg.train)
        x = torch.randint(VOCAB, (2, SEQ))
        wrapped(x, x).backward()
        opt.step()  # creates the AdamW state
        result[layout] = local_state_bytes(model, opt)
    teardown()
    (out / f"rank{rank}.json").write_text(json.dumps(result))


@pytest.mark.parametrize("world", [2, 4])
def test_plan_matches_real_ranks(tmp_path, world):
    spawn(_worker, world, tmp_path)
    real = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for layout in LAYOUTS:
        rank0 = make_plan(_config(layout), world, vocab_size=VOCAB).ranks[0]
        planned = rank0.params + rank0.grads + rank0.optimizer
        for r, measured in enumerate(real):
            held = sum(measured[layout].values())
            assert abs(planned - held) <= 0.10 * held, (layout, world, r, planned, measured[layout])
    # the layouts really differ: FSDP holds about 1/world of DDP's bytes on every rank
    fsdp, ddp = sum(real[0]["fsdp"].values()), sum(real[0]["ddp"].values())
    assert fsdp < ddp / world * 1.1
