"""`exatrain plan --search`: the closed-form shards and collectives it ranks layouts with, against the plan's
measured ones; the search's own rules (valid degrees, memory dropped, sorted); the CLI and its bad input.

The measured side is the plan of one layout (meta-device shards, fake-tensor collectives), which
tests/distributed/test_plan_memory.py and test_plan_comm.py check against real gloo ranks.
"""

import dataclasses
import json
import math

import pytest

from exatrain.config import load_config
from exatrain.models import configured_shape
from exatrain.slurm.profiles import Hardware
from exatrain.tools.plan import analytic, estimate, make_plan, planner, workload
from exatrain.tools.plan.comm import measure_step_comm
from exatrain.tools.plan.layout import measure_rank
from exatrain.tools.plan.search import model_of, search
from exatrain.train.preflight import preflight
from tests.unit.site_files import site_with_hardware

HW = Hardware(peak_tflops=400.0, matmul_tflops=200.0, intra_node_busbw_gbs=100.0, inter_node_busbw_gbs=25.0)
VOCAB = 1000
BASE = ["model.size=tiny", "model.n_layers=4", "data.seq_len=64", "train.precision=bf16"]
LAYOUTS = {  # W = 4
    "fsdp_accumulating": ["parallel.dp_shard=4", "train.micro_batch_size=2", "train.global_batch_size=16"],
    "fsdp_tp_sp": ["parallel.dp_shard=2", "parallel.tp=2", "parallel.sequence_parallel=true"],
    "tp_replicas": ["parallel.dp_replicate=2", "parallel.tp=2"],
    "hsdp_bf16": ["parallel.dp_replicate=2", "parallel.dp_shard=2", "parallel.param_dtype=bf16"],
    "ddp": ["parallel.dp_replicate=4"],
    "pp_1f1b_fsdp": ["parallel.pp=2", "parallel.dp_shard=2", "train.micro_batch_size=4"],
    "pp_interleaved_tp": [
        "parallel.pp=2",
        "parallel.tp=2",
        "parallel.pp_schedule=interleaved_1f1b",
        "parallel.pp_stages_per_rank=2",
        "train.micro_batch_size=4",
    ],
    # blocks that do not divide by the stages: the trainer gives the remainder to the earliest stages
    "pp_uneven_fsdp": [
        "parallel.pp=2",
        "parallel.dp_shard=2",
        "train.micro_batch_size=4",
        "model.n_layers=5",
    ],
    "pp_interleaved_uneven_tp": [
        "parallel.pp=2",
        "parallel.tp=2",
        "parallel.pp_schedule=interleaved_1f1b",
        "parallel.pp_stages_per_rank=2",
        "train.micro_batch_size=4",
        "model.n_layers=6",
    ],
}


def _cfg(name):
    defaults = ["parallel.dp_replicate=1", "train.micro_batch_size=2", "train.global_batch_size=8"]
    return load_config(None, BASE + defaults + LAYOUTS[name])


@pytest.mark.parametrize("name", LAYOUTS)
def test_closed_form_shards_equal_the_measured_ones(name):
    cfg = _cfg(name)
    dims = preflight(cfg, 4)
    chunks = cfg.parallel.pp_stages_per_rank
    for pp_rank in range(dims.pp):
        counted = analytic.rank_shards(model_of(cfg, VOCAB), dims, chunks, pp_rank)
        measured = measure_rank(cfg, 4, pp_rank * (4 // dims.pp), VOCAB)
        grads = measured.param_bytes if measured.grad_bytes is None else measured.grad_bytes
        assert counted.grad_bytes == grads
        assert counted == measured.__class__(**{**measured.__dict__, "grad_bytes": counted.grad_bytes})


@pytest.mark.parametrize("name", ["fsdp_accumulating", "fsdp_tp_sp", "tp_replicas", "hsdp_bf16", "ddp"])
def test_closed_form_collectives_match_the_measured_step(name):
    """Bytes per kind and dimension equal the measured step's up to the scalar all-reduces the closed form
    leaves out (clipping's norms, sequence-parallel norm gradients): under 1 KiB per row here."""
    cfg = _cfg(name)
    dims = preflight(cfg, 4)
    t = cfg.train
    step = analytic.StepShape(
        accumulation=t.global_batch_size // (t.micro_batch_size * dims.dp),
        microbatches=1,
        batch=t.micro_batch_size,
        chunks=1,
        sequence_parallel=cfg.parallel.sequence_parallel,
        loss_parallel=False,
        recompute=False,
    )
    m = model_of(cfg, VOCAB)
    counted = {
        (c.kind, c.dim): c.bytes
        for c in analytic.collectives(m, dims, step, analytic.rank_shards(m, dims, 1, 0))
    }
    measured = {}
    for c in measure_step_comm(cfg, 4, 0, VOCAB):
        measured[(c.kind, c.dim)] = measured.get((c.kind, c.dim), 0) + c.bytes
    assert {k for k, v in measured.items() if v >= 1024} <= set(counted)
    for key in set(counted) | set(measured):
        assert abs(counted.get(key, 0) - measured.get(key, 0)) < 1024, (key, counted, measured)


@pytest.mark.parametrize(
    "replication", [["parallel.dp_replicate=4"], ["parallel.dp_replicate=2", "parallel.tp=2"]]
)
@pytest.mark.parametrize("vocab", [1000, 32000])
def test_closed_form_counts_ddps_buckets_as_the_measured_step(replication, vocab):
    """The gradients' all-reduce is as many calls in closed form as in the measured step (a busbw curve
    runs each at its mean size): torch DDP's buckets (1 MiB, then 25 MiB, in the backward's order) under
    pure replication, 5 to 11 of them here; one call where TP replicas sync their gradients."""
    cfg = load_config(
        None,
        ["model.dim=512", "model.n_layers=8", "model.n_heads=8", "data.seq_len=256"]
        + ["train.micro_batch_size=2", "train.global_batch_size=8"]
        + replication,
    )
    dims = preflight(cfg, 4)
    m = model_of(cfg, vocab)
    step = analytic.StepShape(
        accumulation=1,
        microbatches=1,
        batch=2,
        chunks=1,
        sequence_parallel=False,
        loss_parallel=False,
        recompute=False,
    )
    row = ("all_reduce", "dp_replicate")
    counted = {
        (c.kind, c.dim): c.count
        for c in analytic.collectives(m, dims, step, analytic.rank_shards(m, dims, 1, 0))
    }
    measured = {(c.kind, c.dim): c.count for c in measure_step_comm(cfg, 4, 0, vocab)}
    assert counted[row] == measured[row]
    assert measured[row] > 1 if dims.tp == 1 else measured[row] == 1


def test_search_ranks_valid_layouts_and_agrees_with_the_plan():
    """World size 8, 4 GPUs per node: every result is a valid layout, sorted by predicted step time, within
    the GPU; the memory and step time of a pipeline and of a non-pipeline layout equal what `exatrain plan
    --time` computes for the same options (the non-pipeline plan's measured collectives differ from the
    closed form only by the scalar all-reduces; so does the pipeline plan's, DDP x TP + SP interleaved, with
    the pipeline's loss broadcast)."""
    cfg = load_config(None, BASE + ["train.global_batch_size=16", "parallel.dp_replicate=-1"])
    shape = configured_shape(cfg.model)
    result = search(cfg, 8, VOCAB, HW, 4, 80.0, top=10_000)
    assert result.considered == len(result.layouts) and result.dropped_for_memory == 0
    times = [x.step_time_s for x in result.layouts]
    assert times == sorted(times)
    for lay in result.layouts:
        d = lay.degrees
        assert d["pp"] * d["dp_replicate"] * d["dp_shard"] * d["tp"] == 8
        assert d["tp"] <= 4 and shape.n_heads % d["tp"] == 0 and d["pp"] <= shape.n_layers
    schedules = {x.pp_schedule for x in result.layouts}
    assert {None, "1f1b", "gpipe", "interleaved_1f1b"} <= schedules
    assert {x.activation_checkpoint for x in result.layouts} == {"none", "full"}
    flat = next(x for x in result.layouts if x.pp_schedule is None and x.degrees["tp"] > 1)
    piped = next(x for x in result.layouts if x.pp_schedule == "interleaved_1f1b")
    for lay in (flat, piped):
        chosen = load_config(
            None, BASE + ["train.global_batch_size=16"] + [o[2:] for o in lay.overrides.split()]
        )
        plan = make_plan(chosen, 8, 80.0, VOCAB, hardware=HW, gpus_per_node=4)
        assert plan.peak.total == lay.memory_bytes, lay.overrides
        assert plan.time["step_time_s"] == pytest.approx(lay.step_time_s, rel=1e-3)
    # a pipeline layout's plan measures its send/recv and predicts a bubble
    assert {"send over pp", "recv over pp"} <= set(plan.comm) and plan.time["breakdown"]["bubble_s"] > 0
    # a GPU too small for some layouts: those are dropped, the rest fit
    small = sorted(x.memory_bytes for x in result.layouts)[len(result.layouts) // 2] / 2**30
    cut = search(cfg, 8, VOCAB, HW, 4, small, top=10_000)
    assert cut.dropped_for_memory > 0 and cut.considered == cut.dropped_for_memory + len(cut.layouts)
    assert all(x.memory_bytes <= small * 2**30 for x in cut.layouts)


def _site(tmp_path) -> str:
    hw = dict(peak_tflops=312.0, matmul_tflops=200.0, intra_node_busbw_gbs=100.0, inter_node_busbw_gbs=20.0)
    return site_with_hardware(tmp_path, **hw)


def test_search_cli_json_and_bad_input(exatrain_cli, tmp_path):
    args = ["plan", "--world-size", "8", "--search", "--model.size=tiny", "--data.seq_len=64"]
    r = exatrain_cli(*args, "--site", _site(tmp_path), "--json", "--top", "3", "--train.global_batch_size=16")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    lays = out["layouts"]
    assert len(lays) == 3 and [x["step_time_s"] for x in lays] == sorted(x["step_time_s"] for x in lays)
    assert all({"degrees", "memory_bytes", "why", "overrides", "breakdown"} <= set(x) for x in lays)
    r = exatrain_cli(*args)
    assert r.returncode == 2 and "--site" in r.stderr and "HINT:" in r.stderr and "Traceback" not in r.stderr


INTERLEAVED = ["parallel.pp_schedule=interleaved_1f1b", "parallel.pp_stages_per_rank=2"]
PIPELINE_FSDP = {  # (world size, overrides): FSDP inside pipeline schedules
    "1f1b": (4, ["parallel.pp=2", "parallel.dp_shard=2", "train.micro_batch_size=4"]),
    "1f1b_4_microbatches_accumulating": (
        4,
        ["parallel.pp=2", "parallel.dp_shard=2", "train.micro_batch_size=4", "parallel.pp_microbatches=4"]
        + ["train.global_batch_size=16"],
    ),
    "gpipe_bf16_3_blocks": (
        4,
        ["parallel.pp=2", "parallel.dp_shard=2", "train.micro_batch_size=4", "parallel.pp_schedule=gpipe"]
        + ["parallel.param_dtype=bf16", "model.n_layers=6"],
    ),
    "4_stages": (8, ["parallel.pp=4", "parallel.dp_shard=2", "train.micro_batch_size=4"]),
    # interleaved: counted by walking torch's lowered action list (analytic._fsdp_interleaved)
    "interleaved": (
        4,
        ["parallel.pp=2", "parallel.dp_shard=2", "train.micro_batch_size=4", "parallel.pp_microbatches=4"]
        + INTERLEAVED,
    ),
    "interleaved_bf16_2_blocks_8_microbatches": (
        4,
        ["parallel.pp=2", "parallel.dp_shard=2", "train.micro_batch_size=8", "parallel.pp_microbatches=8"]
        + ["model.n_layers=8", "parallel.param_dtype=bf16", "train.global_batch_size=16"]
        + INTERLEAVED,
    ),
    "interleaved_accumulating": (
        4,
        ["parallel.pp=2", "parallel.dp_shard=2", "train.micro_batch_size=4", "train.global_batch_size=16"]
        + ["parallel.pp_microbatches=4"]
        + INTERLEAVED,
    ),
    "interleaved_3_chunks": (
        4,
        ["parallel.pp=2", "parallel.dp_shard=2", "train.micro_batch_size=4", "model.n_layers=6"]
        + [
            "parallel.pp_microbatches=4",
            "parallel.pp_schedule=interleaved_1f1b",
            "parallel.pp_stages_per_rank=3",
        ],
    ),
    "interleaved_uneven_2_2_1_1": (
        4,
        ["parallel.pp=2", "parallel.dp_shard=2", "train.micro_batch_size=4", "parallel.pp_microbatches=4"]
        + ["model.n_layers=6"]
        + INTERLEAVED,
    ),
    "1f1b_uneven_3_2": (
        4,
        ["parallel.pp=2", "parallel.dp_shard=2", "train.micro_batch_size=4", "model.n_layers=5"],
    ),
    "interleaved_4_stages": (
        8,
        ["parallel.pp=4", "parallel.dp_shard=2", "train.micro_batch_size=4", "parallel.pp_microbatches=4"]
        + ["model.n_layers=8"]
        + INTERLEAVED,
    ),
}


@pytest.mark.parametrize("name", PIPELINE_FSDP)
def test_closed_form_fsdp_inside_a_pipeline_matches_the_measured_step(name):
    """FSDP's gathers and reduce-scatters on every pipeline rank equal the measured step's, count and bytes
    (the measured plan equals real gloo ranks: tests/distributed/test_plan_comm.py)."""
    from exatrain.tools.plan.workload import step_shape

    world, overrides = PIPELINE_FSDP[name]
    defaults = ["parallel.dp_replicate=1", "train.global_batch_size=8"]
    cfg = load_config(None, BASE + defaults + overrides)
    dims = preflight(cfg, world)
    m, step = model_of(cfg, VOCAB), step_shape(cfg, dims)
    for pp_rank in range(dims.pp):
        shards = analytic.rank_shards(m, dims, step.chunks, pp_rank)
        counted = {
            c.kind: (c.count, c.bytes)
            for c in analytic.collectives(m, dims, step, shards)
            if c.dim == "dp_shard"
        }
        measured = {}
        for c in measure_step_comm(cfg, world, pp_rank * (world // dims.pp), VOCAB):
            if c.dim == "dp_shard" and c.kind in ("all_gather", "reduce_scatter"):
                count, nbytes = measured.get(c.kind, (0, 0))
                measured[c.kind] = (count + c.count, nbytes + c.bytes)
        assert counted == measured, (pp_rank, counted, measured)


def test_search_includes_uneven_pipeline_splits_and_prices_their_slowest_stage():
    """Six blocks on 4 ranks: pipeline degree 4 splits them 2, 2, 1, 1 (the trainer's split), a valid layout
    the search now tries. Its predicted step carries the imbalance (rank 0: two blocks and the embeddings,
    the last rank: one block and the head), and it equals what `exatrain plan --time` predicts for the
    same options, with the same memory."""
    cfg = load_config(
        None, BASE + ["model.n_layers=6", "train.global_batch_size=16", "parallel.dp_replicate=-1"]
    )
    result = search(cfg, 4, VOCAB, HW, 4, 80.0, top=10_000)
    four = [x for x in result.layouts if x.degrees["pp"] == 4]
    assert four and all(x.breakdown["pipeline_imbalance_s"] > 0 for x in four)
    lay = four[0]
    chosen = load_config(
        None,
        BASE + ["model.n_layers=6", "train.global_batch_size=16"] + [o[2:] for o in lay.overrides.split()],
    )
    plan = make_plan(chosen, 4, 80.0, VOCAB, hardware=HW, gpus_per_node=4)
    assert plan.peak.total == lay.memory_bytes, lay.overrides
    assert plan.time["step_time_s"] == pytest.approx(lay.step_time_s, rel=1e-3)
    assert plan.time["breakdown"]["pipeline_imbalance_s"] == pytest.approx(
        lay.breakdown["pipeline_imbalance_s"], rel=1e-3
    )


def test_a_search_where_nothing_fits_says_the_smallest_layout_and_how_many_gpus(exatrain_cli):
    """Every valid layout over the GPU's memory: an error naming the smallest layout (the least memory of
    the same search without a GPU size) and the GPUs the weights, gradients and AdamW state need, not an
    empty list."""
    from exatrain.errors import ConfigError
    from exatrain.tools.plan import memory
    from exatrain.tools.plan.search import total_params

    cfg = _cfg("ddp")
    every = search(cfg, 4, VOCAB, HW, 4, None, top=10_000).layouts
    smallest = min(every, key=lambda x: (x.memory_bytes, x.step_time_s))
    gpu_gb = 0.5 * smallest.memory_bytes / memory.GIB
    with pytest.raises(ConfigError) as err:
        search(cfg, 4, VOCAB, HW, 4, gpu_gb)
    message, hint = str(err.value), err.value.hint
    assert f"fits 4 GPUs of {gpu_gb:g} GiB: all {len(every)} valid layouts" in message
    assert f"the smallest needs {memory.gib(smallest.memory_bytes)} per GPU" in message
    assert smallest.overrides in message
    state = total_params(cfg, VOCAB) * (4 + 4 + 8)  # fp32 weights, gradients, AdamW's two moments
    gpus = max(5, math.ceil(state / (gpu_gb * memory.GIB)))
    assert f"alone are {memory.gib(state)}, at least {gpus:,} GPUs" in hint
    args = ["plan", "--world-size=8", "--search", "--site=juwels-booster", "--model.size=tiny"]
    args += ["--model.dim=16384", "--model.n_layers=40", "--model.n_heads=128", "--data.seq_len=2048"]
    r = exatrain_cli(*args, "--train.global_batch_size=8")
    assert r.returncode == 2 and "no layout of this model fits 8 GPUs of 40 GiB" in r.stderr, r.stderr
    assert "HINT: give the job more GPUs" in r.stderr and "Traceback" not in r.stderr


def test_each_pipeline_rank_carries_its_own_stages():
    """workload.stage_loads: per pipeline rank, the FLOPs of its blocks (and their recomputation) and of the
    head on the last rank, and its memory-bound bytes. Checked against the model's FLOPs per token
    (observe.flops, PaLM's 6 N + 12 L D T), the head's 6 V D by hand, and the average rank's bytes."""
    from exatrain.observe.flops import transformer_flops_per_token

    vocab = 5000  # a head as large as a few blocks, as real vocabularies make it
    cfg = load_config(
        None,
        BASE
        + ["parallel.pp=2", "parallel.dp_shard=2", "train.global_batch_size=16", "train.micro_batch_size=4"],
    )
    dims = preflight(cfg, 4)
    shape = configured_shape(cfg.model)
    matmul = planner.shape_params(cfg, vocab) - (vocab + 64) * shape.dim
    loads = workload.stage_loads(cfg, dims, vocab, matmul, workload.Code())
    assert len(loads) == 2
    tokens = 16 * 64 / dims.dp  # through each pipeline rank per step (TP 1)
    flops = [s.matmul_flops + s.attention_flops for s in loads]
    # all ranks together: every token through the whole model once, forward and backward
    whole = transformer_flops_per_token(matmul, shape.n_layers, shape.dim, 64)
    assert sum(flops) == pytest.approx(tokens * whole)
    # 2 blocks each: the last rank's surplus is the head's 6 V D per token
    assert flops[1] - flops[0] == pytest.approx(6 * vocab * shape.dim * tokens)
    # the fused attention's 12 D T per block and token, 2 blocks on each rank
    assert loads[0].attention_flops == pytest.approx(2 * 12 * shape.dim * 64 * tokens)
    # the memory-bound bytes: the average rank's (workload.memory_traffic) is their mean
    average = workload.memory_traffic(cfg, dims, vocab, workload.Code())
    assert sum(s.memory_bytes for s in loads) / 2 == pytest.approx(average)
    assert loads[1].memory_bytes > loads[0].memory_bytes  # the loss over 5000 logits

    # full checkpointing recomputes the blocks' forward (2 N per token more), never the head's
    full = load_config(
        None,
        BASE
        + [
            "parallel.pp=2",
            "parallel.dp_shard=2",
            "train.global_batch_size=16",
            "train.micro_batch_size=4",
            "parallel.activation_checkpoint=full",
        ],
    )
    recomputed = workload.stage_loads(full, preflight(full, 4), vocab, matmul, workload.Code())
    block_params = matmul - vocab * shape.dim
    extra = sum(s.matmul_flops + s.attention_flops for s in recomputed) - sum(flops)
    assert extra == pytest.approx(tokens * (2 * block_params + 4 * shape.n_layers * shape.dim * 64))

    # a run that split its layers 1 + 3: the last rank carries three blocks' FLOPs and the head's
    uneven = workload.stage_loads(cfg, dims, vocab, matmul, workload.Code(stage_layers=(1, 3)))
    per_block = flops[0] / 2
    head = 6 * vocab * shape.dim * tokens
    assert uneven[1].matmul_flops + uneven[1].attention_flops == pytest.approx(3 * per_block + head)
    with pytest.raises(ValueError, match="stage_layers"):
        workload.stage_loads(cfg, dims, vocab, matmul, workload.Code(stage_layers=(2, 1)))
    params = planner.shape_params(cfg, vocab)
    even = search_evaluate(cfg, dims, vocab, params, None)
    skewed = search_evaluate(cfg, dims, vocab, params, (1, 3))
    assert even.breakdown["pipeline_imbalance_s"] > 0  # the head on the last rank
    assert skewed.breakdown["pipeline_imbalance_s"] > even.breakdown["pipeline_imbalance_s"]
    assert skewed.step_time_s > even.step_time_s


@pytest.mark.parametrize("sequence_parallel", [True, False])
def test_a_layouts_options_select_that_layout(sequence_parallel):
    """The options a layout prints (`overrides`) give back its memory and step time, with or without
    sequence parallelism (they used to say sequence_parallel=true for every tensor-parallel layout)."""
    sp = f"parallel.sequence_parallel={str(sequence_parallel).lower()}"
    layout = ["parallel.dp_replicate=2", "parallel.tp=2", "train.micro_batch_size=2", sp]
    cfg = load_config(None, BASE + ["train.global_batch_size=8"] + layout)
    dims = preflight(cfg, 4)
    lay = search_evaluate(cfg, dims, VOCAB, planner.shape_params(cfg, VOCAB), None)
    assert f"--{sp}" in lay.overrides.split(), lay.overrides
    chosen = load_config(None, BASE + ["train.global_batch_size=8"] + [o[2:] for o in lay.overrides.split()])
    again = search_evaluate(chosen, preflight(chosen, 4), VOCAB, planner.shape_params(chosen, VOCAB), None)
    assert (again.memory_bytes, again.step_time_s) == (lay.memory_bytes, lay.step_time_s)


def search_evaluate(cfg, dims, vocab, params, stage_layers):
    """search.evaluate on HW, 4 GPUs per node, an 80 GB GPU."""
    from exatrain.tools.plan.search import evaluate

    return evaluate(cfg, dims, vocab, HW, 4, 80.0, params, workload.Code(stage_layers=stage_layers))


@pytest.mark.parametrize("name", ["tp_replicas", "ddp", "pp_interleaved_tp"])
def test_sixteen_bit_code_moves_half_the_bytes_of_fp32_training(name):
    """workload.Code.weights_16bit, for validation runs whose code keeps its weights, activations and
    gradients in 16 bits (Megatron-LM's Float16Module): every collective of the step is counted at half the
    bytes of the same step trained in fp32 (whose counts the tests above compare with measured steps), the
    data-parallel reduction at the fp32 bytes where the gradients are reduced from fp32 copies
    (Code.fp32_gradients), and the memory-bound kernels no longer cast the weights."""
    cfg = _cfg(name)
    dims = preflight(cfg, 4)
    fp32 = load_config(
        None,
        [
            *BASE,
            "parallel.dp_replicate=1",
            "train.micro_batch_size=2",
            "train.global_batch_size=8",
            *LAYOUTS[name],
            "train.precision=fp32",
        ],
    )
    chunks = cfg.parallel.pp_stages_per_rank if dims.pp_enabled else 1
    wide = model_of(fp32, VOCAB)
    narrow = dataclasses.replace(model_of(cfg, VOCAB), residual_bytes=2, grad_bytes=2)
    assert (wide.elem_bytes, narrow.elem_bytes) == (4, 2)
    shards = analytic.rank_shards(wide, dims, chunks, 0)
    step = workload.step_shape(cfg, dims)
    full = {(c.kind, c.dim): (c.count, c.bytes) for c in analytic.collectives(wide, dims, step, shards)}
    half = {(c.kind, c.dim): (c.count, c.bytes) for c in analytic.collectives(narrow, dims, step, shards)}
    assert full.keys() == half.keys() and full
    for key, (count, nbytes) in full.items():
        assert half[key][0] == count and abs(2 * half[key][1] - nbytes) <= 1, (key, full, half)
    # gradients reduced from fp32 copies (DeepSpeed's bf16 optimizer): the data-parallel row as in fp32
    fp32_grads = dataclasses.replace(narrow, grad_bytes=4)
    mixed = {(c.kind, c.dim): c.bytes for c in analytic.collectives(fp32_grads, dims, step, shards)}
    for key, nbytes in mixed.items():
        assert nbytes == (full[key][1] if key[1].startswith("dp") else half[key][1]), key
    own = workload.memory_traffic(cfg, dims, VOCAB, workload.Code())
    assert workload.memory_traffic(cfg, dims, VOCAB, workload.Code(weights_16bit=True)) < own


@pytest.mark.parametrize("sends, gathers_per_send", [("scatter_gather", 1), ("partitioned", 2)])
def test_pipeline_sends_of_a_tensor_parallel_share_are_gathered(sends, gathers_per_send):
    """workload.Code.pipeline_sends (published codes, for validation runs): each tensor-parallel rank sends
    1/tp of a pipeline send's bytes; Megatron-LM's scatter/gather all-gathers every received tensor over the
    tensor-parallel group (its full bytes) once per send, DeepSpeed's partitioned engine also gathers the
    output it sent again for its backward (rank 0, the first stage: one received gradient and one sent output
    per microbatch); nothing else changes."""
    cfg = _cfg("pp_interleaved_tp")
    dims = preflight(cfg, 4)
    m = model_of(cfg, VOCAB)
    shards = analytic.rank_shards(m, dims, cfg.parallel.pp_stages_per_rank, 0)
    step = workload.step_shape(cfg, dims)
    plain = {(c.kind, c.dim): (c.count, c.bytes) for c in analytic.collectives(m, dims, step, shards)}
    split = dataclasses.replace(m, pipeline_sends=sends)
    sg = {(c.kind, c.dim): (c.count, c.bytes) for c in analytic.collectives(split, dims, step, shards)}
    count, nbytes = plain[("send", "pp")]
    assert sg[("send", "pp")] == (count, nbytes // dims.tp) and sg[("recv", "pp")] == sg[("send", "pp")]
    gathers, gathered = sg[("all_gather", "tp")]
    before = plain.get(("all_gather", "tp"), (0, 0))
    added = (gathers - before[0], gathered - before[1])
    assert added == (gathers_per_send * count, gathers_per_send * nbytes)
    assert {k: v for k, v in sg.items() if k[1] != "pp" and k != ("all_gather", "tp")} == {
        k: v for k, v in plain.items() if k[1] != "pp" and k != ("all_gather", "tp")
    }


def test_a_zero1_optimizer_gathers_the_parameters_over_the_replicas():
    """workload.Code.optimizer "deepspeed-bf16" (DeepSpeed's BF16_Optimizer, published codes): one all-gather
    over dp_replicate after the step of every parameter element of the rank in bf16 (S), nothing else
    changed; none for exatrain's own AdamW, none without replicas."""
    for name, replicas in (("tp_replicas", 2), ("ddp", 4), ("fsdp_accumulating", 1)):
        cfg = _cfg(name)
        dims = preflight(cfg, 4)
        own = model_of(cfg, VOCAB)
        zero1 = model_of(cfg, VOCAB, workload.Code(optimizer="deepspeed-bf16"))
        shards = analytic.rank_shards(own, dims, 1, 0)
        step = workload.step_shape(cfg, dims)
        plain = {(c.kind, c.dim): (c.count, c.bytes) for c in analytic.collectives(own, dims, step, shards)}
        added = {(c.kind, c.dim): (c.count, c.bytes) for c in analytic.collectives(zero1, dims, step, shards)}
        if replicas > 1:
            assert added.pop(("all_gather", "dp_replicate")) == (1, shards.param_elements * 2), name
        assert added == plain, name


SEVEN_B = ["model.size=xl", "model.n_layers=32", "model.dim=4096", "model.n_heads=32", "data.seq_len=2048"]


def _within_a_node(lay, gpus_per_node: int) -> bool:
    """Whether rank 0's FSDP group stays on one node: the mesh puts dp_shard x tp innermost, so the group's
    ranks are consecutive (no FSDP: nothing sharded)."""
    d = lay.degrees
    return d["dp_shard"] == 1 or d["dp_shard"] * d["tp"] <= gpus_per_node


def test_search_names_the_fastest_layout_that_keeps_its_parameters_within_a_node(exatrain_cli):
    """A 7B-shaped model on 16 LUMI-G GCDs (two nodes) with LUMI-G's published constants: the fastest layout
    by the model shards the parameters over both nodes, the prediction no published run bears out. The
    search then names the fastest layout whose FSDP group stays within a node (the kind the validation table
    covers): the first such layout of the whole ranking, at its place there, every layout before it
    sharded across nodes; and the CLI prints it with its options when the list leaves it out (--top 1), and
    in --json. Where the fastest layout is within a node already (the tiny model here), nothing is added."""
    from exatrain.slurm.profiles import load_profile

    lumi = load_profile("lumi-g")
    cfg = load_config(None, SEVEN_B + ["train.precision=bf16", "train.global_batch_size=64"])
    every = search(cfg, 16, 32000, lumi.hardware, lumi.gpus_per_node, 64.0, top=10_000)
    assert all(x.validated == _within_a_node(x, lumi.gpus_per_node) for x in every.layouts)
    k = next(i for i, x in enumerate(every.layouts, 1) if x.validated)
    assert k > 1 and not any(x.validated for x in every.layouts[: k - 1])
    assert every.fastest_validated_rank == k and every.fastest_validated == every.layouts[k - 1]
    one = search(cfg, 16, 32000, lumi.hardware, lumi.gpus_per_node, 64.0, top=1)
    assert one.fastest_validated_rank == k and one.fastest_validated == every.layouts[k - 1]
    tiny = search(load_config(None, BASE + ["train.global_batch_size=16"]), 8, VOCAB, HW, 4, 80.0, top=1)
    assert tiny.layouts[0].validated and tiny.fastest_validated is None

    args = ["plan", "--world-size=16", "--search", "--site=lumi-g", "--vocab-size=32000", "--top=1"]
    args += [f"--{o}" for o in SEVEN_B] + ["--train.global_batch_size=64"]
    r = exatrain_cli(*args)
    assert r.returncode == 0, r.stderr
    lay = every.layouts[k - 1]
    slower = lay.step_time_s / every.layouts[0].step_time_s - 1
    line = "the fastest layout that keeps its parameters within a node (the kind the validation table "
    line += f"covers) is #{k}: {lay.step_time_s * 1e3:,.1f} ms per step, {slower:+.1%} over #1 by the model"
    assert line in r.stdout and f"   {lay.overrides}\n" in r.stdout, r.stdout
    r = exatrain_cli(*args, "--json")
    out = json.loads(r.stdout)
    assert out["fastest_validated_rank"] == k and out["fastest_validated"]["overrides"] == lay.overrides
    assert not out["layouts"][0]["validated"] and out["fastest_validated"]["validated"]
    # with a token target, the named layout gets its own wall time (the same steps at its step time)
    out = json.loads(exatrain_cli(*args, "--target-tokens=1e9", "--json").stdout)
    hours = out["layouts"][0]["wall_time_h"] * lay.step_time_s / every.layouts[0].step_time_s
    assert out["fastest_validated"]["wall_time_h"] == pytest.approx(hours, rel=1e-6)
    # ... and its own sentence for a resource application, with the range of the runs its kind was checked on
    own = out["fastest_validated_target"]
    assert own["wall_time_h"] == out["fastest_validated"]["wall_time_h"]
    assert (
        own["ratio"]["runs"] == estimate.PUBLISHED.runs
        and out["target"]["ratio"]["runs"] != own["ratio"]["runs"]
    )
    text = exatrain_cli(*args, "--target-tokens=1e9").stdout
    head = f"for a resource application (#{k}, the fastest layout that keeps its parameters within a node): "
    assert f"{head}{own['sentence']}\n" in text, text


@pytest.mark.parametrize(
    "degrees, within",
    [
        (["parallel.dp_shard=8"], ("parallel.dp_shard=4", "parallel.dp_replicate=2")),
        (["parallel.dp_shard=4", "parallel.tp=2"], ("parallel.dp_shard=2", "parallel.dp_replicate=2")),
    ],
)
def test_a_plan_sharded_over_nodes_names_the_layout_that_shards_within_a_node(degrees, within):
    """`exatrain plan --time` of a layout whose FSDP group spans two nodes (8 ranks, 4 per node) says so and
    names the same ranks sharding within a node and replicating across nodes (HSDP) as options; that
    layout's own plan carries no such note (its FSDP group stays on one node)."""
    base = BASE + ["train.global_batch_size=16", "train.micro_batch_size=2", "parallel.dp_replicate=1"]
    plan = make_plan(load_config(None, base + degrees), 8, 80.0, VOCAB, hardware=HW, gpus_per_node=4)
    note = next(n for n in plan.assumptions if "parameters sharded over 2 nodes" in n)
    assert f"(--{within[0]} --{within[1]}) stays within what the validation covers" in note
    other = make_plan(
        load_config(None, base + degrees + list(within)), 8, 80.0, VOCAB, hardware=HW, gpus_per_node=4
    )
    assert not any("parameters sharded over" in n for n in other.assumptions)
