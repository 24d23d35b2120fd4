"""`exatrain plan`'s communication per rank per step against REAL gloo ranks, byte for byte.

The plan runs one rank's training step on fake tensors under torch's fake process group and records the
collectives it dispatches (exatrain.tools.plan.comm). Here the trainer runs the same layouts on 2 and 4 real
gloo ranks, three steps each, and torch's flight recorder (TORCH_FR_BUFFER_SIZE: a ring buffer of every
collective a process group issues, with its buffer sizes and dtypes, kept by the C++ process group itself)
gives what each rank really issued in the third step. Per (kind, mesh dimension): count and bytes must be
equal on every rank.

Not reproduced: gloo implements reduce_scatter_tensor with an all-reduce of the whole input (the flight
recorder names it all_reduce), so the plan's reduce-scatters are compared as all-reduces of the same buffer
(nccl-tests' size S: the input, the same bytes either way); NCCL's own algorithms are not exercised.
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
from exatrain.tools.plan.comm import dim_label, measure_step_comm
from exatrain.train.entry import prepare_data
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
LAYOUTS = {
    2: {
        "ddp": ["--parallel.dp_replicate=-1", "--parallel.dp_shard=1"],
        "fsdp": ["--parallel.dp_replicate=1", "--parallel.dp_shard=-1"],
        "tp_sp": [
            "--parallel.dp_replicate=1",
            "--parallel.dp_shard=1",
            "--parallel.tp=2",
            "--parallel.sequence_parallel=true",
        ],
    },
    4: {
        "hsdp": ["--parallel.dp_replicate=2", "--parallel.dp_shard=2"],
        "fsdp_tp": ["--parallel.dp_replicate=1", "--parallel.dp_shard=2", "--parallel.tp=2"],
        "ddp_tp": ["--parallel.dp_replicate=2", "--parallel.dp_shard=1", "--parallel.tp=2"],
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


def _worker(rank, world, env, out):
    os.environ["TORCH_FR_BUFFER_SIZE"] = "100000"  # the flight recorder of every process group it creates
    ctx = init_distributed(env, "cpu", timeout_s=120)
    torch.set_num_threads(1)
    result = {}
    for layout in LAYOUTS[world]:
        trainer = Trainer(_config(world, layout, out), ctx, prepare_data(_config(world, layout, out)))
        for _ in range(2):
            trainer.train_step(trainer._micro_batches())
        before = max([e["record_id"] for e in _trace()["entries"]], default=-1)
        trainer.train_step(trainer._micro_batches())
        result[layout] = _step_collectives(before, _trace())
    teardown()
    (out / f"rank{rank}.json").write_text(json.dumps(result))


def _table(calls, dims) -> dict:
    table = defaultdict(lambda: [0, 0])
    for kind, ranks, nbytes in calls:
        entry = table[f"{GLOO_KIND.get(kind, kind)} over {dim_label(tuple(ranks), dims)}"]
        entry[0] += 1
        entry[1] += nbytes
    return {k: tuple(v) for k, v in table.items()}


@pytest.mark.parametrize("world", [2, 4])
def test_plan_comm_equals_real_ranks(tmp_path, world):
    prepare_data(_config(world, next(iter(LAYOUTS[world])), tmp_path))  # the corpus, cached once
    spawn(_worker, world, tmp_path)
    real = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for layout in LAYOUTS[world]:
        cfg = _config(world, layout, tmp_path)
        dims = ParallelDims.from_config(cfg.parallel, world)
        merged = defaultdict(lambda: [0, 0])  # the plan's kinds mapped to gloo's (may merge two rows)
        for c in measure_step_comm(cfg, world, 0, 512):
            merged[f"{GLOO_KIND.get(c.kind, c.kind)} over {c.dim}"][0] += c.count
            merged[f"{GLOO_KIND.get(c.kind, c.kind)} over {c.dim}"][1] += c.bytes
        planned = {k: tuple(v) for k, v in merged.items()}
        assert planned, layout
        for r, measured in enumerate(real):
            assert _table(measured[layout], dims) == planned, (layout, world, r)
