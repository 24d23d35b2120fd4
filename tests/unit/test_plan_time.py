"""`exatrain plan --time`: the step-time model's arithmetic against hand-computed values, the [hardware]
table of site profiles, and bad input (a HINT naming the key, never a traceback).

The collectives the model takes are measured (tests/distributed/test_plan_comm.py checks them against real
ranks); here they are given by hand, so every expected number below is computed from the formulas in
docs/planning.md, not read from the code under test.
"""

import json

import pytest

from exatrain.errors import ConfigError
from exatrain.slurm.profiles import PROFILE_DIR, Hardware, load_profile, profile_from_dict
from exatrain.tools.plan import estimate
from exatrain.tools.plan.comm import Collective
from tests.unit.site_files import site_with_hardware

HW = Hardware(peak_tflops=400.0, matmul_tflops=200.0, intra_node_busbw_gbs=100.0, inter_node_busbw_gbs=25.0)


def _inputs(**kw):
    base = dict(
        world_size=8,
        gpus_per_node=4,
        flops_per_token=6e9,
        tokens_per_step=8 * 4096,
        recompute_factor=1.0,
        pp=1,
        pp_chunks=1,
        microbatches=1,
        local_param_elements=10**9,
    )
    return estimate.StepInputs(**{**base, **kw})


def test_compute_and_exposed_tensor_parallel():
    # compute: 6e9 FLOP/token x 32768 tokens / (8 GPUs x 200e12 FLOP/s) = 0.12288 s
    tp = Collective(
        "all_reduce", "tp", 2, 10, 4 * 10**9, (0, 1)
    )  # within a node: 4e9 x 2(1/2) / 100e9 = 0.04 s
    t = estimate.step_time(_inputs(), [tp], HW)
    assert t.breakdown["compute_s"] == pytest.approx(0.12288)
    assert t.breakdown["exposed_comm_s"] == pytest.approx(0.04)  # TP is never hidden
    assert t.step_time_s == pytest.approx(0.16288)
    assert t.tokens_per_s == pytest.approx(32768 / 0.16288)
    assert t.tflops_per_gpu == pytest.approx(6e9 * 32768 / 0.16288 / 8 / 1e12)
    assert t.mfu == pytest.approx(t.tflops_per_gpu / 400)


def test_data_parallel_hidden_until_it_exceeds_compute_and_inter_node_is_slower():
    # a dp all-reduce over ranks 0 and 4 crosses nodes (4 GPUs per node) with one rank on each: the node's
    # 4 such groups share its links, so this one gets 25 / 4 GB/s: 2e8 x 1 / 6.25e9 = 0.032 s < compute
    small = Collective("all_reduce", "dp_replicate", 2, 5, 2 * 10**8, (0, 4))
    assert estimate.step_time(_inputs(), [small], HW).breakdown["exposed_comm_s"] == 0
    # 2.5e9 x 1 / 6.25e9 = 0.4 s: a gradient reduction hides only behind the backward, 2/3 of the compute
    # (0.08192 s): 0.4 - 0.08192 exposed
    big = Collective("all_reduce", "dp_replicate", 2, 5, 25 * 10**8, (0, 4))
    assert estimate.step_time(_inputs(), [big], HW).breakdown["exposed_comm_s"] == pytest.approx(
        0.4 - 0.08192
    )
    # the same group inside one node (8 GPUs per node): 2.5e9 / 100e9 = 0.025 s < compute: hidden
    assert estimate.step_time(_inputs(gpus_per_node=8), [big], HW).breakdown["exposed_comm_s"] == 0
    # a group of whole nodes (ranks 0-7, 4 per node) has all of the links: 2.5e9 x 2 (7/8) / 25e9 = 0.175 s
    whole = Collective("all_reduce", "dp_replicate", 8, 5, 25 * 10**8, tuple(range(8)))
    assert estimate.step_time(_inputs(), [whole], HW).breakdown["exposed_comm_s"] == pytest.approx(
        0.175 - 0.08192
    )


def test_gradient_reduction_hides_only_behind_the_last_backward():
    # an all-reduce over ranks 0-7 (whole nodes of 4: all the links): 5e8 x 2 (7/8) / 25e9 = 0.035 s
    reduce = Collective("all_reduce", "dp_replicate", 8, 5, 5 * 10**8, tuple(range(8)))
    # no accumulation: it hides behind the backward, 2/3 of the compute (0.08192 s)
    assert estimate.reduction_window(_inputs(), 0.12288) == pytest.approx(0.08192)
    assert estimate.step_time(_inputs(), [reduce], HW).breakdown["exposed_comm_s"] == 0
    # 4 micro-batches of accumulation: only beside the last one's backward, 0.12288 / 4 x 2/3 = 0.02048 s
    acc = _inputs(accumulation=4)
    assert estimate.reduction_window(acc, 0.12288) == pytest.approx(0.02048)
    assert estimate.step_time(acc, [reduce], HW).breakdown["exposed_comm_s"] == pytest.approx(0.035 - 0.02048)
    # full recomputation: compute 0.16384 s, of which the backward with its recomputed forward is 3/4:
    # 0.16384 / 4 x 3/4 = 0.03072 s
    rc = _inputs(accumulation=4, recompute_factor=4 / 3)
    assert estimate.reduction_window(rc, 0.16384) == pytest.approx(0.03072)
    assert estimate.step_time(rc, [reduce], HW).breakdown["exposed_comm_s"] == pytest.approx(0.035 - 0.03072)
    # a pipeline's 8 microbatches: the last one's backward, 0.12288 / 8 x 2/3
    assert estimate.reduction_window(_inputs(pp=2, microbatches=8), 0.12288) == pytest.approx(0.01024)
    # FSDP's all-gathers hide behind every kernel: 3e9 x 7/8 / 25e9 = 0.105 s of gathers and the 0.035 s
    # reduction (within its 0.08192 s window) make 0.14 s, 0.01712 s more than the kernels
    gathers = Collective("all_gather", "dp_shard", 8, 5, 3 * 10**9, tuple(range(8)))
    both = estimate.step_time(_inputs(), [gathers, reduce], HW).breakdown["exposed_comm_s"]
    assert both == pytest.approx(0.01712)
    # a run whose code reduces after the whole backward (Megatron-LM's local DDP): no window, all 0.035 s
    after = _inputs(reduce_after_backward=True)
    assert estimate.step_time(after, [reduce], HW).breakdown["exposed_comm_s"] == pytest.approx(0.035)


def test_groups_crossing_nodes_share_the_nodes_links():
    # 4 GPUs per node: a group with 1, 2 or 4 ranks on each node gets 1/4, 1/2 or all of its links
    assert estimate.node_links_share((0, 4), 4) == 0.25
    assert estimate.node_links_share((0, 1, 4, 5), 4) == 0.5
    assert estimate.node_links_share(tuple(range(8)), 4) == 1.0
    assert estimate.node_links_share((0, 1, 2, 4), 4) == 0.25  # the node with the fewest sets the pace
    # a pipeline send to the next node, one per rank: 1e9 / (25e9 / 4) = 0.16 s, in the critical path
    send = Collective("send", "pp", 2, 10, 10**9, (0, 4))
    assert estimate.step_time(_inputs(), [send], HW).breakdown["exposed_comm_s"] == pytest.approx(0.16)


def test_bus_factors_bubble_recompute_and_optimizer():
    # all-gather over 4 ranks in a node: S x 3/4 / busbw
    assert estimate.collective_seconds("all_gather", 4 * 10**9, 4, False, HW) == pytest.approx(0.03)
    assert estimate.collective_seconds("send", 10**9, 2, True, HW) == pytest.approx(0.04)
    assert estimate.collective_seconds("all_reduce", 10**9, 1, True, HW) == 0
    # pipeline bubble: compute x (p - 1) / (m x chunks)
    t = estimate.step_time(_inputs(pp=4, microbatches=8, pp_chunks=2), [], HW)
    assert t.breakdown["bubble_s"] == pytest.approx(0.12288 * 3 / 16)
    assert estimate.recompute_factor("full", 1) == pytest.approx(4 / 3)
    assert estimate.recompute_factor("every", 2) == pytest.approx(1 + 1 / 6)
    # AdamW: 28 bytes per element at hbm_gbs
    hbm = Hardware(**{**HW.__dict__, "hbm_gbs": 1000.0})
    assert estimate.step_time(_inputs(), [], hbm).breakdown["optimizer_s"] == pytest.approx(28e9 / 1e12)


def test_a_zero1_optimizer_updates_its_partition_and_gathers_after_the_step():
    """DeepSpeed's BF16_Optimizer (a published code of the validation): 34 bytes per element of the rank's
    1/DP partition and 8 per gradient element; its all-gather of the parameters over dp_replicate comes after
    the step, beside no kernel: exposed, where FSDP's gathers over dp_shard hide behind the kernels."""
    hbm = Hardware(**{**HW.__dict__, "hbm_gbs": 1000.0})
    zero1 = _inputs(optimizer="deepspeed-bf16", optimizer_partitions=4)
    # 1e9 elements: 1e9 / 4 x 34 + 1e9 x 8 = 16.5e9 bytes at 1000 GB/s
    assert estimate.step_time(zero1, [], hbm).breakdown["optimizer_s"] == pytest.approx(16.5e9 / 1e12)
    # 2e9 bytes gathered over ranks 0-7 (whole nodes of 4): 2e9 x 7/8 / 25e9 = 0.07 s, all of it exposed
    gather = Collective("all_gather", "dp_replicate", 8, 1, 2 * 10**9, tuple(range(8)))
    assert estimate.step_time(zero1, [gather], hbm).breakdown["exposed_comm_s"] == pytest.approx(0.07)
    fsdp = Collective("all_gather", "dp_shard", 8, 1, 2 * 10**9, tuple(range(8)))
    assert estimate.step_time(zero1, [fsdp], hbm).breakdown["exposed_comm_s"] == 0


def test_memory_bound_kernels_add_to_compute_and_hide_data_parallel_traffic():
    # 2e9 bytes of memory-bound kernels at 1000 GB/s: 2 ms, added to the 0.12288 s of compute
    hbm = Hardware(**{**HW.__dict__, "hbm_gbs": 1000.0})
    t = estimate.step_time(_inputs(memory_bytes=2e9, local_param_elements=0), [], hbm)
    assert t.breakdown["memory_bound_s"] == pytest.approx(0.002)
    assert t.step_time_s == pytest.approx(0.12288 + 0.002)
    # FSDP's all-gathers of 0.124 s (1.55e9 bytes x 1/2 / 6.25e9: one rank per node, a quarter of the node's
    # 25 GB/s) are longer than the compute (0.12288 s) but hidden behind compute and memory-bound kernels
    # together (0.12488 s)
    dp = Collective("all_gather", "dp_shard", 2, 5, 155 * 10**7, (0, 4))
    t = estimate.step_time(_inputs(memory_bytes=2e9, local_param_elements=0), [dp], hbm)
    assert t.breakdown["exposed_comm_s"] == 0
    # the pipeline bubble idles both: (compute + memory) x (p - 1) / (m x chunks)
    t = estimate.step_time(_inputs(memory_bytes=2e9, pp=4, microbatches=8), [], hbm)
    assert t.breakdown["bubble_s"] == pytest.approx(0.12488 * 3 / 8)
    # without hbm_gbs the memory term is not counted (the plan's note says so)
    assert estimate.step_time(_inputs(memory_bytes=2e9), [], HW).breakdown["memory_bound_s"] == 0


def test_the_slowest_pipeline_rank_sets_the_pace():
    # two pipeline ranks, 4 microbatches: rank 0 runs 2e15 FLOPs per step (10 s at 200 TF/s), rank 1 runs
    # 3e15 FLOPs (15 s) and 1e12 bytes of memory-bound kernels (1 s at 1000 GB/s): 16 s. The slowest rank
    # runs its 4 microbatches back to back (16 s) and rank 0 adds its fill and drain (10 s / 4): 18.5 s;
    # the average rank's 13 s plus the bubble (13 s x 1 / 4) is 16.25 s, so the imbalance is 2.25 s
    # = (16 - 13) x (1 - 1 / 4)
    hbm = Hardware(**{**HW.__dict__, "hbm_gbs": 1000.0})
    stages = (
        estimate.StageLoad(matmul_flops=2e15, attention_flops=0.0, memory_bytes=0.0),
        estimate.StageLoad(matmul_flops=3e15, attention_flops=0.0, memory_bytes=1e12),
    )
    inputs = _inputs(pp=2, microbatches=4, stages=stages)
    assert estimate.pipeline_imbalance(inputs, hbm) == pytest.approx(2.25)
    t = estimate.step_time(inputs, [], hbm)
    assert t.breakdown["pipeline_imbalance_s"] == pytest.approx(2.25)
    kernels = t.breakdown["compute_s"] + t.breakdown["memory_bound_s"]
    assert t.step_time_s == pytest.approx(
        kernels + t.breakdown["bubble_s"] + 2.25 + t.breakdown["optimizer_s"]
    )
    # the fused attention's FLOPs at its own rate: 1e15 at 100 TF/s on rank 0 makes it the slowest (20 s)
    fast = Hardware(**{**hbm.__dict__, "attention_tflops": 100.0})
    slow0 = (estimate.StageLoad(2e15, 1e15, 0.0), stages[1])
    # average (20 + 16) / 2 = 18, slowest 20: (20 - 18) x 3 / 4
    assert estimate.pipeline_imbalance(_inputs(pp=2, microbatches=4, stages=slow0), fast) == pytest.approx(
        1.5
    )
    # interleaved: 2 stages per rank, 8 chunks in flight: (16 - 13) x (1 - 1 / 8)
    two = _inputs(pp=2, microbatches=4, pp_chunks=2, stages=stages)
    assert estimate.pipeline_imbalance(two, hbm) == pytest.approx(3 * 7 / 8)
    # equal ranks: no imbalance, the bubble alone
    even = (stages[0], stages[0])
    assert estimate.pipeline_imbalance(_inputs(pp=2, microbatches=4, stages=even), hbm) == 0


def test_fused_attention_runs_at_its_own_rate_when_measured():
    # 1e9 of the 6e9 FLOP/token are the fused attention kernel's: at 200 and 100 TF/s,
    # (5e9 / 200e12 + 1e9 / 100e12) x 32768 tokens / 8 GPUs = 0.14336 s
    slow = Hardware(**{**HW.__dict__, "attention_tflops": 100.0})
    t = estimate.step_time(_inputs(attention_flops_per_token=1e9), [], slow)
    assert t.breakdown["compute_s"] == pytest.approx(0.14336)
    # MFU and TF/s still count the model's FLOPs, not the rates
    assert t.tflops_per_gpu == pytest.approx(6e9 * 32768 / 0.14336 / 8 / 1e12)
    # without a measured attention rate, attention runs at matmul_tflops (0.12288 s, as above)
    assert estimate.step_time(_inputs(attention_flops_per_token=1e9), [], HW).breakdown[
        "compute_s"
    ] == pytest.approx(0.12288)
    # materialised attention (attention_flops_per_token 0) is matrix products: the attention rate is unused
    assert estimate.step_time(_inputs(), [], slow).breakdown["compute_s"] == pytest.approx(0.12288)


def test_materialised_attention_products_run_at_the_slower_of_their_flops_and_bytes():
    """Attention products with the scores in memory (score_flops_per_token, score_bytes) take the roofline:
    their FLOPs at matmul_tflops or their bytes at hbm_gbs, whichever is slower."""
    hbm = Hardware(**{**HW.__dict__, "hbm_gbs": 1000.0})
    # 1e9 of the 6e9 FLOP/token: 1e9 x 32768 / 8 / 200e12 = 0.02048 s of products; the other 5e9 0.1024 s
    flops_bound = _inputs(score_flops_per_token=1e9, score_bytes=1e10)  # 1e10 B / 1e12 B/s = 0.01 s < 0.02048
    assert estimate.step_time(flops_bound, [], hbm).breakdown["compute_s"] == pytest.approx(0.12288)
    bytes_bound = _inputs(score_flops_per_token=1e9, score_bytes=5e10)  # 0.05 s > 0.02048 s
    t = estimate.step_time(bytes_bound, [], hbm)
    assert t.breakdown["compute_s"] == pytest.approx(0.1024 + 0.05)
    assert t.breakdown["memory_bound_s"] == 0  # the products' bytes are theirs, not the other kernels'
    # a profile without hbm_gbs: the FLOPs alone
    assert estimate.step_time(bytes_bound, [], HW).breakdown["compute_s"] == pytest.approx(0.12288)
    # a pipeline rank's own products likewise (stage_seconds)
    load = estimate.StageLoad(
        matmul_flops=1e12, attention_flops=0.0, memory_bytes=0.0, score_flops=2e12, score_bytes=2e13
    )
    assert estimate.stage_seconds(load, hbm) == pytest.approx(1e12 / 200e12 + 2e13 / 1e12)


def test_on_cpu_nodes_communication_adds_to_the_step():
    """CPU ranks compute and communicate on the same cores: a data-parallel all-reduce that a GPU step hides
    (0.032 s < 0.12288 s of compute, as above) adds its whole time."""
    small = Collective("all_reduce", "dp_replicate", 2, 5, 2 * 10**8, (0, 4))
    t = estimate.step_time(_inputs(overlap=False), [small], HW)
    assert t.breakdown["exposed_comm_s"] == pytest.approx(0.032)
    assert t.step_time_s == pytest.approx(0.12288 + 0.032)


def test_a_measured_busbw_curve_sets_each_collectives_bandwidth_by_its_size():
    """With nccl-tests' busbw by message size (intra_node_busbw_curve), a collective runs at the curve's
    busbw at its mean call size, interpolated in log size between the measured points and held at the
    end points beyond them; without one, at the single figure whatever the size."""
    curve = ((2**20, 40.0), (2**22, 80.0), (2**28, 200.0))
    hw = Hardware(**{**HW.__dict__, "intra_node_busbw_curve": curve})
    assert estimate.bus_bandwidth(hw, False, 2**20) == 40.0
    assert estimate.bus_bandwidth(hw, False, 2**21) == pytest.approx(60.0)  # halfway in log size
    assert estimate.bus_bandwidth(hw, False, 2**25) == pytest.approx(80.0 + 120.0 * 3 / 6)
    assert estimate.bus_bandwidth(hw, False, 2**10) == 40.0  # below the smallest point: its value
    assert estimate.bus_bandwidth(hw, False, 2**33) == 200.0  # above the largest: its value
    assert estimate.bus_bandwidth(hw, True, 2**21) == 25.0  # no inter-node curve: the one figure
    assert estimate.bus_bandwidth(HW, False, 2**21) == 100.0  # no curve at all
    # 16 all-reduces of 2 MiB over 2 ranks: S x 2(1/2) / 60 GB/s; with the figure, / 100 GB/s
    nbytes = 16 * 2**21
    assert estimate.collective_seconds("all_reduce", nbytes, 2, False, hw, calls=16) == pytest.approx(
        nbytes / 60e9
    )
    assert estimate.collective_seconds("all_reduce", nbytes, 2, False, HW, calls=16) == pytest.approx(
        nbytes / 100e9
    )
    # the step takes the count of calls from the measured collective: the same 2 MiB calls, exposed (TP)
    tp = Collective("all_reduce", "tp", 2, 16, nbytes, (0, 1))
    assert estimate.step_time(_inputs(), [tp], hw).breakdown["exposed_comm_s"] == pytest.approx(nbytes / 60e9)


def test_busbw_curves_are_parsed_and_validated():
    """A profile's curve is a list of [bytes, GB/s] pairs in increasing size; anything else is an error
    naming the key with a HINT showing the form."""
    from exatrain.config.load import read_toml

    data = read_toml(str(PROFILE_DIR / "lumi-g.toml"))
    table = {"matmul_tflops": 150, "inter_node_busbw_curve": [[1024, 0.5], [268435456, 21.25]]}
    hw = profile_from_dict({**data, "hardware": table}).hardware
    assert hw.inter_node_busbw_curve == ((1024.0, 0.5), (268435456.0, 21.25))
    assert hw.intra_node_busbw_curve == ()
    for bad in ([[1024, 0.5], [512, 1.0]], [[1024, -1.0]], [[1024]], 3.0, [["1k", 2.0]]):
        with pytest.raises(ConfigError, match="inter_node_busbw_curve") as e:
            profile_from_dict({**data, "hardware": {"inter_node_busbw_curve": bad}})
        assert "[[1048576, 36.2]" in e.value.hint


def test_hardware_table_is_parsed_and_validated(tmp_path):
    from exatrain.config.load import read_toml

    assert load_profile("lumi-g").hardware.peak_tflops == 191.5  # half an MI250X (one GCD)
    assert load_profile("cpu").hardware is None
    data = read_toml(str(PROFILE_DIR / "lumi-g.toml"))
    ok = profile_from_dict({**data, "hardware": {"matmul_tflops": 150, "inter_node_busbw_gbs": 20.5}})
    assert ok.hardware.matmul_tflops == 150.0 and ok.hardware.missing(estimate.TIME_KEYS) == [
        "intra_node_busbw_gbs"
    ]
    with pytest.raises(ConfigError, match="matmul_tflops = -1 is negative"):
        profile_from_dict({**data, "hardware": {"matmul_tflops": -1}})
    with pytest.raises(ConfigError, match="unknown key"):
        profile_from_dict({**data, "hardware": {"matmul_tflop": 1.0}})
    with pytest.raises(ConfigError, match="source = 'guessed' is not one of") as e:
        profile_from_dict({**data, "hardware": {"source": "guessed"}})
    assert 'source = "measured"' in e.value.hint


def test_bundled_profiles_carry_published_constants_with_their_sources():
    """lumi-g, juwels-booster and jureca-dc carry every key `--time` needs, marked "published": for LUMI-G
    the MI250X GCD's figures of the validation table (the same sources); for the JSC A100 40 GB nodes the
    validation A100's peak and matmul figures, NVLink 3's line rate (300 GB/s per direction: the busbw
    measured on the validation's 8-GPU NVSwitch nodes is not that of these 4-GPU nodes), the 40 GB card's
    data-sheet memory bandwidth (1555 GB/s) and the node's NICs as the inter-node bound (JUWELS Booster
    4 x 200 Gb/s, JURECA-DC 2 x 100 Gb/s)."""
    import tomllib

    from tests.unit.test_plan_validation import HW_KEYS, ROOT

    machines = tomllib.loads((ROOT / "tests/data/plan_validation.toml").read_text())["hardware"]
    lumi = load_profile("lumi-g")
    assert lumi.hardware.source == "published" and not lumi.hardware.missing(estimate.TIME_KEYS)
    assert {k: getattr(lumi.hardware, k) for k in HW_KEYS} == {k: machines["mi250x-gcd"][k] for k in HW_KEYS}
    assert lumi.gpus_per_node == machines["mi250x-gcd"]["gpus_per_node"]
    a100 = machines["a100-80gb"]
    for name, nics, gbit in (("juwels-booster", 4, 200), ("jureca-dc", 2, 100)):
        hw = load_profile(name).hardware
        assert hw.source == "published" and not hw.missing(estimate.TIME_KEYS), name
        assert (hw.peak_tflops, hw.matmul_tflops) == (a100["peak_tflops"], a100["matmul_tflops"])
        assert hw.intra_node_busbw_gbs == 600 / 2 > a100["intra_node_busbw_gbs"], name
        assert hw.hbm_gbs == 1555.0 and hw.inter_node_busbw_gbs == nics * gbit / 8, name


def test_the_plan_says_where_its_constants_come_from(exatrain_cli, tmp_path):
    """A bundled profile's published constants are called that (text and --json), in --time and --search; a
    profile whose [hardware] came from the doctor says measured."""
    args = ["plan", "--world-size", "16", "--model.size=tiny", "--data.seq_len=64"]
    args += ["--train.global_batch_size=32", "--train.micro_batch_size=2"]
    r = exatrain_cli(*args, "--site", "lumi-g", "--time")
    assert r.returncode == 0, r.stderr
    assert (
        "hardware constants: PUBLISHED figures" in r.stdout and "not measured on your allocation" in r.stdout
    )
    r = exatrain_cli(*args, "--site", "lumi-g", "--time", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["constants"] == "published", r.stderr
    r = exatrain_cli(*args, "--site", "juwels-booster", "--search", "--top", "1")
    assert r.returncode == 0 and "hardware constants: PUBLISHED figures" in r.stdout, r.stderr
    r = exatrain_cli(*args, "--site", "juwels-booster", "--search", "--top", "1", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["constants"] == "published", r.stderr
    measured = _site(
        tmp_path,
        source="measured",
        matmul_tflops=200.0,
        intra_node_busbw_gbs=100.0,
        inter_node_busbw_gbs=20.0,
    )
    r = exatrain_cli(*args, "--site", measured, "--time")
    assert r.returncode == 0, r.stderr
    assert "hardware constants: measured" in r.stdout and "PUBLISHED" not in r.stdout


def _site(tmp_path, **hardware) -> str:
    return site_with_hardware(tmp_path, peak_tflops=312.0, **hardware)


@pytest.mark.parametrize(
    "site, expected",
    [
        (None, "[hardware] lacks matmul_tflops, intra_node_busbw_gbs, inter_node_busbw_gbs"),  # peak only
        ("cpu", "has no [hardware] table"),
    ],
)
def test_time_without_hardware_names_the_keys(exatrain_cli, tmp_path, site, expected):
    site = site or _site(tmp_path)
    r = exatrain_cli("plan", "--world-size", "8", "--site", site, "--time", "--model.size=tiny")
    assert r.returncode == 2 and expected in r.stderr and "HINT:" in r.stderr, r.stderr
    assert "measure them with `exatrain doctor`" in r.stderr and "Traceback" not in r.stderr


def test_a_one_node_job_needs_no_inter_node_bandwidth(exatrain_cli, tmp_path):
    """The [hardware] lines the doctor prints on one node (no inter-node busbw) predict a job on one node of
    the site (4 GPUs of JUWELS Booster); a job on two nodes still asks for the inter-node key."""
    site = _site(tmp_path, matmul_tflops=200.0, intra_node_busbw_gbs=100.0, hbm_gbs=1555.0)
    args = ["plan", "--site", site, "--time", "--model.size=tiny", "--train.global_batch_size=16"]
    r = exatrain_cli(*args, "--world-size=4", "--parallel.dp_shard=4", "--train.micro_batch_size=4")
    assert r.returncode == 0 and "predicted step:" in r.stdout, r.stderr
    r = exatrain_cli(*args, "--world-size=8", "--parallel.dp_shard=8", "--train.micro_batch_size=2")
    assert r.returncode == 2 and "[hardware] lacks inter_node_busbw_gbs" in r.stderr, r.stderr
    assert "HINT:" in r.stderr and "Traceback" not in r.stderr


def test_a_one_rank_job_needs_no_bandwidth(exatrain_cli, tmp_path):
    """The [hardware] lines the doctor prints on one GPU (no busbw: one rank has nothing to all-reduce with)
    predict a one-rank job; two ranks on the same node still ask for the intra-node key."""
    site = _site(tmp_path, matmul_tflops=200.0, hbm_gbs=1555.0)
    args = ["plan", "--site", site, "--time", "--model.size=tiny", "--train.global_batch_size=16"]
    r = exatrain_cli(*args, "--world-size=1", "--train.micro_batch_size=16")
    assert r.returncode == 0 and "exposed comm 0.00 ms" in r.stdout, r.stderr
    r = exatrain_cli(*args, "--world-size=2", "--train.micro_batch_size=8")
    assert r.returncode == 2 and "[hardware] lacks intra_node_busbw_gbs" in r.stderr, r.stderr
    assert "inter_node" not in r.stderr and "Traceback" not in r.stderr


def test_world_size_not_filling_nodes_and_time_without_site(exatrain_cli):
    r = exatrain_cli("plan", "--world-size", "6", "--site", "juwels-booster", "--model.size=tiny")
    assert r.returncode == 2 and "gpus_per_node = 4" in r.stderr and "HINT:" in r.stderr, r.stderr
    r = exatrain_cli("plan", "--world-size", "4", "--time", "--model.size=tiny")
    assert r.returncode == 2 and "--site" in r.stderr and "HINT:" in r.stderr, r.stderr


def test_text_output_gives_the_published_range_of_the_step_and_the_wall_time(exatrain_cli, tmp_path):
    """The table output prints the predicted step and, under it, the step at the published runs' lowest
    and highest measured / predicted ratios; with --target-tokens the wall time at those ratios."""
    import re

    site = _site(tmp_path, matmul_tflops=200.0, intra_node_busbw_gbs=100.0, inter_node_busbw_gbs=20.0)
    r = exatrain_cli(
        "plan",
        "--world-size=2",
        f"--site={site}",
        "--target-tokens=1e9",
        "--model.size=tiny",
        "--data.seq_len=64",
        "--train.micro_batch_size=2",
        "--train.global_batch_size=4",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    step = float(re.search(r"predicted step: ([\d.]+) ms", r.stdout).group(1))
    low, high = estimate.PUBLISHED.low, estimate.PUBLISHED.high
    m = re.search(
        rf"the {estimate.PUBLISHED.runs} published training runs took ([\d.]+)-([\d.]+) x the model's step "
        r".*: ([\d.]+)-([\d.]+) ms here",
        r.stdout,
    )
    assert m, r.stdout
    assert (float(m.group(1)), float(m.group(2))) == (low, high)
    assert float(m.group(3)) == pytest.approx(step * low, abs=0.01)
    assert float(m.group(4)) == pytest.approx(step * high, abs=0.01)
    hours_line = re.search(
        r"steps, ([\d.,]+) h wall time .* at the published runs' ratios ([\d.,]+)-([\d.,]+) h", r.stdout
    )
    assert hours_line, r.stdout
    hours = [float(g.replace(",", "")) for g in hours_line.groups()]
    assert hours[1] == pytest.approx(hours[0] * low, rel=0.01) and hours[2] == pytest.approx(
        hours[0] * high, rel=0.01
    )


def test_json_has_the_prediction(exatrain_cli, tmp_path):
    site = _site(
        tmp_path, matmul_tflops=200.0, intra_node_busbw_gbs=100.0, inter_node_busbw_gbs=20.0, hbm_gbs=1555.0
    )
    r = exatrain_cli(
        "plan",
        "--world-size",
        "4",
        "--site",
        site,
        "--time",
        "--json",
        "--model.size=tiny",
        "--data.seq_len=64",
        "--train.micro_batch_size=2",
        "--train.global_batch_size=8",
        "--parallel.dp_shard=2",
        "--parallel.tp=2",
        "--target-tokens",
        "1e9",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    b = plan["breakdown"]
    assert set(b) == {
        "compute_s",
        "memory_bound_s",
        "exposed_comm_s",
        "bubble_s",
        "pipeline_imbalance_s",
        "optimizer_s",
    }
    assert b["pipeline_imbalance_s"] == 0  # no pipeline
    assert b["memory_bound_s"] > 0 and b["optimizer_s"] > 0  # hbm_gbs given
    # 1e9 tokens / 512 per step = 1953125 steps; 4 ranks on one JUWELS Booster node at 48 core-hours per hour
    assert plan["wall_time_h"] == pytest.approx(1953125 * plan["step_time_s"] / 3600)
    assert plan["cost"]["units"] == pytest.approx(48 * plan["wall_time_h"])
    assert plan["cost"]["unit"] == "core-hours" and plan["cost"]["rule"] == "whole-node"
    # where real steps fell around the prediction on the published runs, and the wall time and units at it
    ratio = plan["published_ratio"]  # its values: test_plan_validation.py checks them against the table
    assert (
        set(ratio) == {"runs", "low", "median", "high", "of"}
        and ratio["low"] < ratio["median"] < ratio["high"]
    )
    assert ratio["of"] == "published training runs"  # FSDP within one node: the whole table's ratio
    low, high = ratio["low"], ratio["high"]
    assert plan["wall_time_range_h"] == pytest.approx([plan["wall_time_h"] * low, plan["wall_time_h"] * high])
    assert plan["cost"]["units_range"] == pytest.approx(
        [plan["cost"]["units"] * low, plan["cost"]["units"] * high]
    )
    assert plan["step_time_s"] == pytest.approx(sum(b.values()))
    assert plan["tokens_per_s"] == pytest.approx(8 * 64 / plan["step_time_s"])
    assert plan["mfu"] == pytest.approx(plan["tflops_per_gpu"] / 312)
    # FSDP over dp_shard gathers and reduce-scatters, TP all-reduces: each row with calls and bytes
    assert {"all_gather over dp_shard", "reduce_scatter over dp_shard"} <= set(plan["comm"])
    assert any(k.endswith("over tp") for k in plan["comm"])
    assert all(
        row["count"] > 0 and row["bytes"] > 0
        for k, row in plan["comm"].items()
        if k != "all_reduce over self"
    )
