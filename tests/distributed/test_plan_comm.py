"""`exatrain plan`'s communication per rank per step against REAL gloo ranks, byte for byte.

The plan runs one rank's training step on fake tensors under torch's fake process group and records the
collectives it dispatches (exatrain.tools.plan.comm). Here the trainer runs the same layouts on 2, 4 and 8
real gloo ranks: W = 2: DDP, FSDP, TP + SP, and a 2-stage pipeline under each schedule (GPipe; 1F1B with
gradient accumulation under bf16 autocast; interleaved 1F1B with 2 stages per rank); W = 4: HSDP, FSDP x
TP, TP replicas, PP x FSDP (gradient accumulation, bf16 parameters), PP x TP + SP; W = 8: HSDP 2 x 4 and
PP 2 x FSDP 2 x TP 2 + SP (interleaved 1F1B). Each runs until its steady state (DDP: 3 steps, the others
2); what each rank really issued in the last step comes from two recorders: torch's flight recorder
(TORCH_FR_BUFFER_SIZE: a ring buffer of every collective a process group issues, with its buffer sizes and
dtypes, kept by the C++ process group itself) and, for the pipeline's point-to-point operations (which the
flight recorder keeps no record of under gloo), a wrapper around
`torch.distributed.pipelining.schedules._batch_p2p`, through which every send and receive of the schedules
goes. Per (kind, mesh dimension): count and bytes must equal the plan's for that rank's pipeline rank, on
every rank. For the pipeline layouts, the send/recv `exatrain plan --search` counts in closed form
(exatrain.tools.plan.analytic) must equal them too.

Not reproduced: gloo implements reduce_scatter_tensor with an all-reduce of the whole input (the flight
recorder names it all_reduce), so the plan's reduce-scatters are compared as all-reduces of the same buffer
(nccl-tests' size S: the input, the same bytes either way); NCCL's own algorithms are not exercised. The
pipeline's first step differs (real ranks exchange the stages' shapes, the plan gives them statically);
only the steady state is compared.
"""

import json
import os
import pickle
from collections import defaultdict

import pytest
import torch

from exatrain.config import load_config
from exatrain.distributed import init_distributed, teardown
from exatrain.distributed.parallel_dims import ParallelDims
from exatrain.models import configured_shape
from exatrain.tools.plan import analytic
from exatrain.tools.plan.comm import dim_label, measure_step_comm
from exatrain.tools.plan.search import model_of
from exatrain.train.entry import prepare_data
from exatrain.train.preflight import preflight
from exatrain.train.trainer import Trainer
from tests.distributed.helpers import spawn

pytestmark = pytest.mark.dist

BASE = [
    "--model.size=tiny",
    "--data.seq_len=16",
    "--train.micro_batch_size=1",
    "--train.global_batch_size=4",
    "--train.precision=fp32",
]
PP = ["--model.n_layers=4", "--parallel.pp=2", "--parallel.dp_replicate=1"]
SP = ["--parallel.tp=2", "--parallel.sequence_parallel=true"]
LAYOUTS = {
    2: {
        "ddp": ["--parallel.dp_replicate=-1", "--parallel.dp_shard=1"],
        "fsdp": ["--parallel.dp_replicate=1", "--parallel.dp_shard=-1"],
        "tp_sp": ["--parallel.dp_replicate=1", "--parallel.dp_shard=1", *SP],
        # pipelines: GPipe 2 pipeline microbatches; 1F1B 2 x 2 accumulation steps under bf16 autocast (the
        # hidden states between stages stay fp32); interleaved 4 x 1
        "pp_gpipe": [
            *PP,
            "--parallel.pp_schedule=gpipe",
            "--train.micro_batch_size=2",
            "--train.global_batch_size=2",
        ],
        "pp_1f1b": [
            *PP,
            "--parallel.pp_schedule=1f1b",
            "--train.micro_batch_size=2",
            "--train.precision=bf16",
        ],
        "pp_interleaved": [
            *PP,
            "--parallel.pp_schedule=interleaved_1f1b",
            "--parallel.pp_stages_per_rank=2",
            "--train.micro_batch_size=4",
        ],
    },
    4: {
        "hsdp": ["--parallel.dp_replicate=2", "--parallel.dp_shard=2"],
        "fsdp_tp": ["--parallel.dp_replicate=1", "--parallel.dp_shard=2", "--parallel.tp=2"],
        "ddp_tp": ["--parallel.dp_replicate=2", "--parallel.dp_shard=1", "--parallel.tp=2"],
        "pp_fsdp": [  # 2 accumulation steps: FSDP reduce-scatters after each one under a pipeline; bf16
            *PP,
            "--parallel.dp_shard=2",
            "--train.precision=bf16",
            "--parallel.param_dtype=bf16",
            "--parallel.pp_schedule=1f1b",
            "--train.micro_batch_size=2",
            "--train.global_batch_size=8",
        ],
        "pp_tp_sp": [
            *PP,
            "--parallel.dp_shard=1",
            *SP,
            "--parallel.pp_schedule=gpipe",
            "--train.micro_batch_size=2",
        ],
    },
    8: {
        "hsdp": ["--parallel.dp_replicate=2", "--parallel.dp_shard=4", "--train.global_batch_size=8"],
        "pp_fsdp_tp_sp": [
            *PP,
            "--parallel.dp_shard=2",
            *SP,
            "--parallel.pp_schedule=interleaved_1f1b",
            "--parallel.pp_stages_per_rank=2",
            "--train.micro_batch_size=4",
            "--train.global_batch_size=8",
        ],
    },
}
DTYPE_BYTES = {"Float": 4, "BFloat16": 2, "Half": 2, "Double": 8, "Long": 8, "Int": 4, "Byte": 1, "Bool": 1}
GLOO_KIND = {"reduce_scatter": "all_reduce"}  # gloo's reduce_scatter_tensor is an all-reduce (docstring)


def _config(world, layout, run_dir):
    return load_config(None, BASE + LAYOUTS[world][layout] + [f"--run.dir={run_dir}/{layout}"])


def _trace():
    return pickle.loads(torch._C._distributed_c10d._dump_fr_trace())


def _nbytes(sizes, dtypes) -> int:
    return sum(
        int(torch.tensor(s).prod()) * DTYPE_BYTES[d] if s else DTYPE_BYTES[d] for s, d in zip(sizes, dtypes)
    )


def _group_ranks() -> dict[str, list[int]]:
    """{process group name: its global ranks} of every group this rank is in (the flight recorder names the
    group of each entry; under gloo it leaves its own table of groups empty)."""
    from torch.distributed import distributed_c10d as c10d

    return {name: c10d.get_process_group_ranks(pg) for pg, name in c10d._world.pg_names.items()}


def _step_collectives(before: int, trace) -> list[tuple[str, list[int], int]]:
    """(kind, group ranks, nccl-tests size S) of the entries recorded after record id `before`."""
    groups = _group_ranks()
    out = []
    for e in trace["entries"]:
        if e["record_id"] <= before:
            continue
        kind = e["profiling_name"].split(":", 1)[1]
        ranks = groups[e["process_group"][0]]
        nbytes = _nbytes(e["input_sizes"], e["input_dtypes"])
        # all-gather: S is the gathered output, group size x the input (the recorder's output size of the
        # functional all-gather under gloo is the input's: it is not used)
        out.append((kind, ranks, nbytes * len(ranks) if kind == "all_gather" else nbytes))
    return out


def _record_p2p(calls: list) -> None:
    """Record every point-to-point operation torch's pipeline schedules issue (the flight recorder keeps
    no gloo send/recv): all go through `schedules._batch_p2p`, a list of P2POp (isend or irecv, tensor,
    peer, group)."""
    from torch.distributed.pipelining import schedules

    original = schedules._batch_p2p

    def recording(ops, *args, **kwargs):
        for op in ops:
            kind = "send" if op.op is torch.distributed.isend else "recv"
            ranks = torch.distributed.get_process_group_ranks(op.group or torch.distributed.group.WORLD)
            calls.append((kind, ranks, op.tensor.numel() * op.tensor.element_size()))
        return original(ops, *args, **kwargs)

    schedules._batch_p2p = recording


def _ddp(cfg, world: int) -> bool:
    """Does the layout use torch's DDP (exatrain.distributed.wrap._replicate: pure replication without TP
    and PP)? DDP rebuilds its buckets in its second step: the third is its steady state; the other layouts
    are steady from their second (after FSDP's lazy init and the pipeline's shape exchange)."""
    dims = ParallelDims.from_config(cfg.parallel, world)
    return dims.ddp and not dims.tp_enabled and not dims.pp_enabled


def _worker(rank, world, env, out):
    os.environ["TORCH_FR_BUFFER_SIZE"] = "100000"  # the flight recorder of every process group it creates
    p2p = []
    _record_p2p(p2p)
    ctx = init_distributed(env, "cpu", timeout_s=120)
    torch.set_num_threads(1)
    result = {}
    for layout in LAYOUTS[world]:
        trainer = Trainer(_config(world, layout, out), ctx, prepare_data(_config(world, layout, out)))
        for _ in range(2 if _ddp(_config(world, layout, out), world) else 1):
            trainer.train_step(trainer._micro_batches())
        before = max([e["record_id"] for e in _trace()["entries"]], default=-1)
        p2p.clear()
        trainer.train_step(trainer._micro_batches())
        result[layout] = _step_collectives(before, _trace()) + p2p
    teardown()
    (out / f"rank{rank}.json").write_text(json.dumps(result))


def _table(calls, dims) -> dict:
    table = defaultdict(lambda: [0, 0])
    for kind, ranks, nbytes in calls:
        entry = table[f"{GLOO_KIND.get(kind, kind)} over {dim_label(tuple(ranks), dims)}"]
        entry[0] += 1
        entry[1] += nbytes
    return {k: tuple(v) for k, v in table.items()}


def _planned(cfg, world: int, rank: int) -> dict:
    """The plan's table of `rank`, the plan's kinds mapped to gloo's (which may merge two rows)."""
    merged = defaultdict(lambda: [0, 0])
    for c in measure_step_comm(cfg, world, rank, 512):
        merged[f"{GLOO_KIND.get(c.kind, c.kind)} over {c.dim}"][0] += c.count
        merged[f"{GLOO_KIND.get(c.kind, c.kind)} over {c.dim}"][1] += c.bytes
    return {k: tuple(v) for k, v in merged.items()}


def _closed_form_p2p(cfg, world: int, pp_rank: int) -> dict:
    """The pipeline send/recv `exatrain plan --search` counts in closed form (analytic.collectives) for
    the first rank of `pp_rank`, as rows of the table."""
    dims = preflight(cfg, world)
    p, t = cfg.parallel, cfg.train
    micro = dims.microbatches(p)
    step = analytic.StepShape(
        accumulation=t.global_batch_size // (t.micro_batch_size * dims.dp),
        microbatches=micro,
        batch=t.micro_batch_size // micro,
        chunks=p.pp_stages_per_rank,
        sequence_parallel=p.sequence_parallel,
        loss_parallel=False,
        recompute=False,
    )
    m = model_of(cfg, 512)
    assert m.shape == configured_shape(cfg.model)
    shards = analytic.rank_shards(m, dims, p.pp_stages_per_rank, pp_rank)
    return {
        f"{c.kind} over {c.dim}": (c.count, c.bytes)
        for c in analytic.collectives(m, dims, step, shards)
        if c.kind in ("send", "recv")
    }


@pytest.mark.parametrize("world", [2, 4, 8])
def test_plan_comm_equals_real_ranks(tmp_path, world):
    """Per layout and real rank: the plan measured for that rank's pipeline rank (its first rank: data- and
    tensor-parallel peers issue the same collectives) equals what the rank issued, per kind and dimension."""
    prepare_data(_config(world, next(iter(LAYOUTS[world])), tmp_path))  # the corpus, cached once
    spawn(_worker, world, tmp_path)
    real = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for layout in LAYOUTS[world]:
        cfg = _config(world, layout, tmp_path)
        dims = ParallelDims.from_config(cfg.parallel, world)
        per_pp = world // dims.pp
        planned = [_planned(cfg, world, p * per_pp) for p in range(dims.pp)]
        assert all(planned), layout
        for r, measured in enumerate(real):
            table = _table(measured[layout], dims)
            assert table == planned[r // per_pp], (layout, world, r)
            if dims.pp_enabled:  # the search's closed form: the pipeline's send/recv
                counted = _closed_form_p2p(cfg, world, r // per_pp)
                assert counted == {k: table[k] for k in ("send over pp", "recv over pp")}, (layout, r)
