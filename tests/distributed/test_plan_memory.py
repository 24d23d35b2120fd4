"""`exatrain plan`'s parameter + gradient + optimizer bytes per rank against REAL gloo ranks.

The plan builds the layout on the meta device under a fake process group; here the trainer builds the same
layouts on 2 and 4 real ranks (FSDP, DDP, TP, PP and their products with FSDP), takes an AdamW step and a
second backward, and each rank sums the bytes of the local parameter, gradient and optimizer-state shards
it holds. The plan describes rank 0 of each pipeline rank's group: those ranks must match it to the byte;
the other ranks within 1 % (an uneven FSDP shard is one row shorter on the last ranks).

Activations: at W = 2, under tensor parallel alone and with sequence parallel, each rank also measures the
bytes of the tensors autograd saves for backward in one training forward of its model (its local shards,
each storage once, parameters excluded), which must be within 10 % of the plan's activation estimate per
microbatch, as for the plain and checkpointed single-process cases in tests/unit/test_plan.py.
"""

import json

import pytest
import torch

from exatrain.config import load_config
from exatrain.distributed import init_distributed, teardown
from exatrain.distributed.parallelize import local_tensor
from exatrain.tools.plan import make_plan
from exatrain.tools.plan.layout import local_state_bytes
from exatrain.train.entry import prepare_data
from exatrain.train.trainer import Trainer
from tests.distributed.helpers import spawn

pytestmark = pytest.mark.dist

SEQ = 32
BASE = [
    "--model.size=small",
    f"--data.seq_len={SEQ}",
    "--train.micro_batch_size=2",
    "--train.global_batch_size=8",
    "--train.precision=fp32",
]
LAYOUTS = {  # name -> overrides; the world size comes from the test
    "fsdp": ["--parallel.dp_replicate=1", "--parallel.dp_shard=-1"],
    "ddp": ["--parallel.dp_replicate=-1", "--parallel.dp_shard=1"],
    "tp": [
        "--parallel.dp_replicate=1",
        "--parallel.dp_shard=-1",
        "--parallel.tp=2",
    ],  # W=2: TP alone; W=4: FSDP x TP
    "pp": [
        "--parallel.dp_replicate=1",
        "--parallel.dp_shard=-1",
        "--parallel.pp=2",
    ],  # W=2: PP alone; W=4: PP x FSDP
}
ONLY_AT_2 = {
    "tp_sp": [
        "--parallel.dp_replicate=1",
        "--parallel.dp_shard=1",
        "--parallel.tp=2",
        "--parallel.sequence_parallel=true",
    ]
}
ACTIVATIONS_AT_2 = ("tp", "tp_sp")  # layouts whose saved tensors are measured (W = 2: TP alone, TP + SP)
ACTIVATION_TOL = 0.10
ONLY_AT_4 = {
    "pp_tp": ["--parallel.dp_replicate=1", "--parallel.dp_shard=1", "--parallel.pp=2", "--parallel.tp=2"],
    "hsdp": ["--parallel.dp_replicate=2", "--parallel.dp_shard=2"],
}


def _layouts(world: int) -> dict:
    return {**LAYOUTS, **(ONLY_AT_4 if world == 4 else ONLY_AT_2)}


def _config(layout: str, run_dir):
    return load_config(
        None, BASE + {**LAYOUTS, **ONLY_AT_2, **ONLY_AT_4}[layout] + [f"--run.dir={run_dir}/{layout}"]
    )


def _saved_activation_bytes(trainer) -> int:
    """Bytes of this rank's tensors that autograd saves for backward in one training forward (the loss
    included, as the engine runs it), counted on the local shards of DTensors, each storage once,
    parameters (and views of them, such as a transposed weight) excluded."""
    model, (x, y) = trainer.engine.model, trainer._micro_batches()[0]
    params = {local_tensor(p).untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        storage = local_tensor(t.detach()).untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with trainer.engine._context(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        trainer.engine.model(x, y)
    return sum(n for ptr, n in seen.items() if ptr not in params)


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
        if world == 2 and layout in ACTIVATIONS_AT_2:
            result[layout]["activations"] = _saved_activation_bytes(trainer)
    teardown()
    (out / f"rank{rank}.json").write_text(json.dumps(result))


@pytest.fixture(scope="module")
def real_ranks(tmp_path_factory):
    """world -> (its directory, what each real rank measured); each world size is started once per module."""
    done = {}

    def measure(world: int):
        if world not in done:
            tmp = tmp_path_factory.mktemp(f"plan-w{world}")
            prepare_data(_config("ddp", tmp))  # the synthetic corpus, cached once before the ranks start
            spawn(_worker, world, tmp)
            done[world] = tmp, [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(world)]
        return done[world]

    return measure


@pytest.mark.parametrize("world", [2, 4])
def test_plan_matches_real_ranks(real_ranks, world):
    tmp_path, real = real_ranks(world)
    for layout in _layouts(world):
        plan = make_plan(_config(layout, tmp_path), world)
        per_pp_rank = world // len(plan.ranks)  # plan.ranks: rank 0 of each pipeline rank's group
        for r, ranks_layouts in enumerate(real):
            # activations: checked by test_tp_activation_estimate_matches_saved_tensors
            measured = {
                k: {n: v for n, v in m.items() if n != "activations"} for k, m in ranks_layouts.items()
            }
            p = plan.ranks[r // per_pp_rank]
            planned = {"params": p.params, "grads": p.grads, "optimizer": p.optimizer}
            if r % per_pp_rank == 0:  # the rank the plan describes: equal to the byte, part by part
                assert planned == measured[layout], (layout, world, r, planned, measured[layout])
            else:  # other ranks of its group may hold a shard one row shorter (FSDP pads uneven dims)
                held = sum(measured[layout].values())
                assert abs(sum(planned.values()) - held) <= 0.01 * held, (
                    layout,
                    world,
                    r,
                    planned,
                    measured[layout],
                )
    # the layouts really differ: FSDP holds about 1/world of DDP's bytes on every rank
    fsdp, ddp = sum(real[0]["fsdp"].values()), sum(real[0]["ddp"].values())
    assert fsdp < ddp / world * 1.1


@pytest.mark.parametrize("layout", ACTIVATIONS_AT_2)
def test_tp_activation_estimate_matches_saved_tensors(real_ranks, layout):
    """The plan's activations per microbatch (formula in tools/plan/memory.py) against the bytes each real
    rank's autograd keeps for one forward under TP (2 ranks), alone and with sequence parallel: within
    10 %."""
    tmp_path, real = real_ranks(2)
    estimate = make_plan(_config(layout, tmp_path), 2).ranks[0].activation_per_microbatch
    for rank, measured in enumerate(real):
        saved = measured[layout]["activations"]
        print(
            f"{layout} rank {rank}: estimate {estimate} B, saved tensors {saved} B ({estimate / saved:.3f})"
        )
        assert abs(estimate - saved) <= ACTIVATION_TOL * saved, (layout, rank, estimate, saved)
