"""The pipeline send/recv bytes `exatrain plan --search` counts in closed form
(exatrain.tools.plan.analytic.collectives) against REAL gloo pipeline ranks, count and bytes equal.

The trainer runs each schedule (GPipe, 1F1B, interleaved 1F1B with 2 stages per rank) on 2 real gloo ranks,
three steps; every point-to-point operation torch's pipeline schedules issue goes through
`torch.distributed.pipelining.schedules._batch_p2p` (a list of P2POp: isend or irecv, tensor, peer), which
a recording wrapper counts in the third step (the flight recorder keeps no gloo send/recv). Per rank:
sends and receives, count and bytes, equal to the closed form.

Not covered here: the other collectives of a pipeline layout (FSDP or TP inside a stage, the scalar
broadcast and all-reduce the schedule and clipping issue over pp). `exatrain plan` without --search measures
all of them on fake tensors; tests/distributed/test_plan_comm.py compares that with real ranks.
"""

import json
import os

import pytest
import torch

from exatrain.config import load_config
from exatrain.distributed import init_distributed, teardown
from exatrain.models import configured_shape
from exatrain.tools.plan import analytic
from exatrain.tools.plan.search import model_of
from exatrain.train.entry import prepare_data
from exatrain.train.preflight import preflight
from exatrain.train.trainer import Trainer
from tests.distributed.helpers import spawn

pytestmark = pytest.mark.dist

BASE = [
    "--model.size=tiny",
    "--model.n_layers=4",
    "--data.seq_len=16",
    "--train.micro_batch_size=4",
    "--train.global_batch_size=8",
    "--train.precision=fp32",
    "--parallel.pp=2",
    "--parallel.dp_replicate=1",
]
SCHEDULES = {
    "gpipe": ["--parallel.pp_schedule=gpipe"],
    "1f1b": ["--parallel.pp_schedule=1f1b", "--parallel.pp_microbatches=4"],
    "interleaved": ["--parallel.pp_schedule=interleaved_1f1b", "--parallel.pp_stages_per_rank=2"],
}


def _config(name, run_dir):
    return load_config(None, BASE + SCHEDULES[name] + [f"--run.dir={run_dir}/{name}"])


def _worker(rank, world, env, out):
    from torch.distributed.pipelining import schedules

    calls = []
    original = schedules._batch_p2p

    def recording(ops, *args, **kwargs):
        for op in ops:
            kind = "send" if op.op in (torch.distributed.isend,) else "recv"
            calls.append((kind, op.tensor.numel() * op.tensor.element_size()))
        return original(ops, *args, **kwargs)

    schedules._batch_p2p = recording
    ctx = init_distributed(env, "cpu", timeout_s=120)
    torch.set_num_threads(1)
    result = {}
    for name in SCHEDULES:
        trainer = Trainer(_config(name, out), ctx, prepare_data(_config(name, out)))
        for _ in range(2):
            trainer.train_step(trainer._micro_batches())
        calls.clear()
        trainer.train_step(trainer._micro_batches())
        table = {}
        for kind, nbytes in calls:
            count, total = table.get(kind, (0, 0))
            table[kind] = (count + 1, total + nbytes)
        result[name] = table
    teardown()
    (out / f"rank{rank}.json").write_text(json.dumps(result))


def test_closed_form_pipeline_send_recv_equals_real_ranks(tmp_path):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    prepare_data(_config("gpipe", tmp_path))  # the corpus, cached once
    spawn(_worker, 2, tmp_path)
    real = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for name in SCHEDULES:
        cfg = _config(name, tmp_path)
        dims = preflight(cfg, 2)
        p, t = cfg.parallel, cfg.train
        micro = dims.microbatches(p)
        step = analytic.StepShape(
            accumulation=t.global_batch_size // (t.micro_batch_size * dims.dp),
            microbatches=micro,
            batch=t.micro_batch_size // micro,
            chunks=p.pp_stages_per_rank,
            sequence_parallel=False,
            loss_parallel=False,
            recompute=False,
        )
        m = model_of(cfg, 512)
        assert m.shape == configured_shape(cfg.model)
        for r in range(2):
            shards = analytic.rank_shards(m, dims, p.pp_stages_per_rank, r)
            counted = {c.kind: [c.count, c.bytes] for c in analytic.collectives(m, dims, step, shards)}
            assert {k: counted[k] for k in ("send", "recv")} == real[r][name], (name, r, counted)
