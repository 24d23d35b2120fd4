"""`exatrain plan`'s parameter + gradient + optimizer bytes per rank against REAL gloo ranks.

The plan builds the layout on the meta device under a fake process group; here the trainer builds the same
layouts on 2 and 4 real ranks (FSDP, DDP, TP, PP and their products with FSDP), takes an AdamW step and a
second backward, and each rank sums the bytes of the local parameter, gradient and optimizer-state shards
it holds. The plan describes rank 0 of each pipeline rank's group: those ranks must match it to the byte;
the other ranks within 1 % (an uneven FSDP shard is one row shorter on the last ranks).
"""

import json

import pytest
import torch

from exatrain.config import load_config
from exatrain.distributed import init_distributed, teardown
from exatrain.train.plan import make_plan
from exatrain.train.plan.layout import local_state_bytes
from exatrain.train.run import prepare_data
from exatrain.train.trainer import Trainer
from tests.distributed.helpers import spawn

pytestmark = pytest.mark.dist

SEQ = 32
BASE = ["--model.size=small", f"--data.seq_len={SEQ}", "--train.micro_batch_size=2", "--train.global_batch_size=8"]
LAYOUTS = {  # name -> overrides; the world size comes from the test
    "fsdp": ["--parallel.dp_replicate=1", "--parallel.dp_shard=-1"],
    "ddp": ["--parallel.dp_replicate=-1", "--parallel.dp_shard=1"],
    "tp": ["--parallel.dp_replicate=1", "--parallel.dp_shard=-1", "--parallel.tp=2"],  # W=2: TP alone; W=4: FSDP x TP
    "pp": ["--parallel.dp_replicate=1", "--parallel.dp_shard=-1", "--parallel.pp=2"],  # W=2: PP alone; W=4: PP x FSDP
}
ONLY_AT_4 = {"pp_tp": ["--parallel.dp_replicate=1", "--parallel.dp_shard=1", "--parallel.pp=2", "--parallel.tp=2"],
             "hsdp": ["--parallel.dp_replicate=2", "--parallel.dp_shard=2"]}


def _layouts(world: int) -> dict:
    return {**LAYOUTS, **(ONLY_AT_4 if world == 4 else {})}


def _config(layout: str, run_dir):
    return load_config(None, BASE + {**LAYOUTS, **ONLY_AT_4}[layout] + [f"--run.dir={run_dir}/{layout}"])


def _worker(rank, world, env, out):
    ctx = init_distributed(env, "cpu", timeout_s=120)
    torch.set_num_threads(1)
    result = {}
    for layout in _layouts(world):
        cfg = _config(layout, out)
        trainer = Trainer(cfg, ctx, prepare_data(cfg))  # the layout exactly as training builds it
        trainer.train_step(trainer._micro_batches())  # creates the AdamW state (and drops the gradients)
        trainer.engine.train_step(trainer._micro_batches())  # gradients again: params, grads, state all held
        result[layout] = local_state_bytes(trainer.model, trainer.optimizer)
    teardown()
    (out / f"rank{rank}.json").write_text(json.dumps(result))


@pytest.mark.parametrize("world", [2, 4])
def test_plan_matches_real_ranks(tmp_path, world):
    prepare_data(_config("ddp", tmp_path))  # the synthetic corpus, cached once before the ranks start
    spawn(_worker, world, tmp_path)
    real = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for layout in _layouts(world):
        plan = make_plan(_config(layout, tmp_path), world)
        per_pp_rank = world // len(plan.ranks)  # plan.ranks: rank 0 of each pipeline rank's group
        for r, measured in enumerate(real):
            p = plan.ranks[r // per_pp_rank]
            planned = {"params": p.params, "grads": p.grads, "optimizer": p.optimizer}
            if r % per_pp_rank == 0:  # the rank the plan describes: equal to the byte, part by part
                assert planned == measured[layout], (layout, world, r, planned, measured[layout])
            else:  # other ranks of its group may hold a shard one row shorter (FSDP pads uneven dims)
                held = sum(measured[layout].values())
                assert abs(sum(planned.values()) - held) <= 0.01 * held, (layout, world, r, planned, measured[layout])
    # the layouts really differ: FSDP holds about 1/world of DDP's bytes on every rank
    fsdp, ddp = sum(real[0]["fsdp"].values()), sum(real[0]["ddp"].values())
    assert fsdp < ddp / world * 1.1
