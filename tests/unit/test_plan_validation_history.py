"""The history bullets of docs/plan-validation-history.md up to the MPT runs' FSDP1 gradient path
(2026-11-28): each earlier state of the validation table, recomputed under the treatment of its day (the
sources as the page then took them, tests/unit/plan_validation_past.py), and the figures each bullet states.
The later bullets, each a fact read in a run's own code or log:
tests/unit/test_plan_validation_history_code.py. The table itself, its readings and its inputs:
tests/unit/test_plan_validation.py."""

from __future__ import annotations

from exatrain.models import ModelShape
from exatrain.tools.plan import estimate, traffic
from tests.unit.plan_validation_past import (
    HISTORY,
    before_the_fsdp1_path,
    before_the_lumi_log,
    busbw_without_curves,
    deepspeed_fp32_reduction,
    errors,
    figures,
    megatron_rows,
    mpt_norms_in_fp32,
    mpt_rows,
    products_at_the_matmul_rate,
    under_autocast,
    without_accumulation,
)
from tests.unit.test_plan_validation import (
    DATA,
    DATA_SHEETS,
    KORTHIKANTI,
    PIPELINED_MEGATRON,
    _changed_rows,
    _errors_with_machines,
    _korthikanti,
    _median_worst,
    _pipelined_megatron,
    _signed,
)


def test_the_history_of_the_runs_own_settings_and_measured_constants(monkeypatch):
    """The history bullet of 2026-11-28, over the 17 runs the table then had (the runs' own code settings,
    then measured constants): the table before (for [1] micro batch 1, gradients reduced after the
    backward and fp32 weights, for [4] and [5] fp32 weights; data sheets), with the code settings alone, and
    with the measured constants, each recomputed; then the pipelined rows of [1] added (23 runs). [4] and
    [5] as the page then took them: gradients all-reduced in fp32 (corrected in the next bullet)."""
    before_the_fsdp1_path(monkeypatch)
    products_at_the_matmul_rate(monkeypatch)
    text = " ".join(HISTORY.read_text().split())
    added = {f"megatron-{size}" for size in PIPELINED_MEGATRON} | {f"korthikanti-{s}" for s in KORTHIKANTI}
    monkeypatch.setitem(DATA, "source", deepspeed_fp32_reduction())
    monkeypatch.setitem(DATA, "run", [r for r in DATA["run"] if not r["id"].startswith("korthikanti-")])
    now = errors()
    seventeen = [r for r in DATA["run"] if r["id"] not in added]
    assert len(seventeen) == 17
    monkeypatch.setitem(DATA, "run", seventeen)
    constants = errors()
    settings = _errors_with_machines(DATA_SHEETS)
    runs = [dict(r, micro_batch=1) if r["source"] == "narayanan2021" else r for r in seventeen]
    source = {
        k: {f: v for f, v in s.items() if f not in ("weights", "gradients")}
        for k, s in DATA["source"].items()
    }
    source["narayanan2021"]["gradient_reduction"] = "after_backward"
    monkeypatch.setitem(DATA, "source", source)
    monkeypatch.setitem(DATA, "run", runs)
    before = _errors_with_machines(DATA_SHEETS)
    for state in (before, settings, constants):
        median, worst = _median_worst(state)
        stated = f"{_changed_rows(state)} (median {median} %, worst {worst} %)"
        assert stated in text, stated
    median, worst = _median_worst(now)
    stated = f"{_pipelined_megatron(now)} (over the 23 runs median {median} %, worst {worst} %)"
    assert len(now) == 23 and stated in text, stated


def test_the_history_of_the_bf16_reduction_and_the_rows_of_source_6(monkeypatch):
    """The history bullet after it: [4] and [5] with their gradients all-reduced in bf16 (the 23 runs of the
    bullet before), then the four rows of [6] added; each recomputed, under autocast as then."""
    before_the_fsdp1_path(monkeypatch)
    products_at_the_matmul_rate(monkeypatch)
    text = " ".join(HISTORY.read_text().split())
    monkeypatch.setitem(DATA, "source", under_autocast())
    now = errors()
    monkeypatch.setitem(DATA, "run", [r for r in DATA["run"] if not r["id"].startswith("korthikanti-")])
    corrected = errors()
    lumi = ", ".join(_signed(corrected[f"lumi-{size}"]) for size in ("7b", "33b", "175b"))
    median, worst = _median_worst(corrected)
    stated = (
        f"bloom-176b {_signed(corrected['bloom-176b'])}; lumi {lumi} (median {median} %, worst {worst} %)"
    )
    assert len(corrected) == 23 and stated in text, stated
    stated = f"{_korthikanti(now)} {figures(now)}"
    assert stated in text, stated


def test_the_history_of_the_runs_own_precision(monkeypatch):
    """The bullet before the last: the codes of [1], [4], [5] and [6] without autocast (Code.autocast
    False: 16-bit norms, no activation casts); the rows it moved and the table's figures then, recomputed
    (no accumulation counted for the published codes)."""
    before_the_fsdp1_path(monkeypatch)
    products_at_the_matmul_rate(monkeypatch)
    text = " ".join(HISTORY.read_text().split())
    monkeypatch.setitem(DATA, "source", mpt_norms_in_fp32(without_accumulation()))
    now = errors()
    stated = f"{megatron_rows(now)} {figures(now)}"
    assert stated in text, stated
    sixteen = {
        k for k, v in DATA["source"].items() if v.get("weights") == "16-bit" and v.get("norms") == "16-bit"
    }
    assert sixteen == {"narayanan2021", "bloom", "lumi-scaling", "korthikanti2022"}


def test_the_history_of_the_runs_own_accumulation(monkeypatch):
    """The bullet before the last: the gradient accumulation of the codes of [1] (16-bit main_grad adds)
    and of [4] and [5] (DeepSpeed's bf16 optimizer) counted; the rows it moved and the table's figures then
    (the MPT runs' norms in fp32)."""
    before_the_fsdp1_path(monkeypatch)
    products_at_the_matmul_rate(monkeypatch)
    text = " ".join(HISTORY.read_text().split())
    monkeypatch.setitem(DATA, "source", mpt_norms_in_fp32(DATA["source"]))
    now = errors()
    stated = f"{_changed_rows(now)}; {_pipelined_megatron(now)} {figures(now)}"
    assert stated in text, stated
    ways = {k: v["accumulation"] for k, v in DATA["source"].items() if "accumulation" in v}
    assert ways == {
        "narayanan2021": "16-bit",
        "bloom": "deepspeed-bf16",
        "lumi-scaling": "deepspeed-bf16",
        "exatrain-h100": "autograd",
        "exatrain-h200": "autograd",
    }


def _flops_per_byte(head_dim: int, seq_len: int = 2048) -> float:
    """FLOPs per byte of one 16-bit attention product (traffic.score_product_bytes: a T x T matrix and two
    T x d_head ones per head), 2 T d_head FLOPs per token and head."""
    shape = ModelShape(dim=head_dim, n_layers=1, n_heads=1)
    kernels = traffic.Kernels(shape, 512, seq_len, elem_bytes=2, attention="materialised")
    work = traffic.RankWork(
        tokens=1, blocks=1, recomputed_blocks=0, forwards=1, batch=1, embeddings=0, head=0
    )
    return 6 * 2 * seq_len * head_dim / traffic.score_product_bytes(kernels, work)


def test_the_history_of_the_attention_products_roofline(monkeypatch):
    """The bullet before the last: the materialised attention's products at their roofline; the rows of the
    codes that keep the scores in memory and the table's figures, recomputed (the LUMI rows unmoved), and
    the FLOPs per byte it quotes."""
    before_the_fsdp1_path(monkeypatch)
    busbw_without_curves(monkeypatch)
    text = " ".join(HISTORY.read_text().split())
    ridge = {
        m: DATA["hardware"][m]["matmul_tflops"] / DATA["hardware"][m]["hbm_gbs"] * 1e3
        for m in ("a100-80gb", "mi250x-gcd")
    }
    quoted = f"(about {round(_flops_per_byte(96))} and {round(_flops_per_byte(128))} "
    quoted += f"against {round(ridge['a100-80gb'])}); "
    quoted += f"on the MI250X ({round(ridge['mi250x-gcd'])})"
    assert quoted in text, quoted
    assert _flops_per_byte(96) < _flops_per_byte(128) < ridge["a100-80gb"]
    assert ridge["mi250x-gcd"] < _flops_per_byte(128)
    now = errors()
    stated = f"{megatron_rows(now)} {figures(now)}"
    assert stated in text, stated
    kept = {k for k, v in DATA["source"].items() if v.get("attention") == "materialised"}
    assert kept == {"narayanan2021", "bloom", "lumi-scaling", "korthikanti2022"}
    products_at_the_matmul_rate(monkeypatch)
    before = errors()
    assert all(before[k] == now[k] for k in now if k.startswith("lumi-"))
    assert all(
        now[k] > before[k] for k in now if k.startswith(("megatron-", "korthikanti-", "bloom-"))
    )  # slower


def test_the_history_of_the_busbw_curves(monkeypatch):
    """The bullet before the last: the A100 and H100 collectives at their own size's busbw; the rows it
    moved, the table's figures, and the rows it did not move (MPT, LUMI), recomputed."""
    before_the_fsdp1_path(monkeypatch)
    text = " ".join(HISTORY.read_text().split())
    now = errors()
    stated = f"{megatron_rows(now)} {figures(now)}"
    assert stated in text, stated
    curves = {k for k, hw in DATA["hardware"].items() if "intra_node_busbw_curve" in hw}
    assert curves == {"a100-80gb", "a100-80gb-jz", "h100-80gb"}
    # one micro batch's activations, 16-bit, per tensor-parallel all-reduce of the runs of [1], [4], [6]
    number = {k: v.get("number") for k, v in DATA["source"].items()}
    sizes = [
        r["micro_batch"] * r["seq_len"] * r["dim"] * 2
        for r in DATA["run"]
        if number[r["source"]] in (1, 4, 6) and r["tp"] > 1
    ]
    curve = tuple(tuple(p) for p in DATA["hardware"]["a100-80gb"]["intra_node_busbw_curve"])
    low, high = (estimate.curve_at(curve, size) for size in (min(sizes), max(sizes)))
    stated = f"{round(min(sizes) / 1e6)} to {round(max(sizes) / 1e6)} MB, where the curve is {round(low)} to "
    stated += f"{round(high)} GB/s, not {DATA['hardware']['a100-80gb']['intra_node_busbw_gbs']} at every size"
    assert stated in text, stated
    busbw_without_curves(monkeypatch)
    before = errors()
    assert all(before[k] == now[k] for k in now if k.startswith(("mpt-", "lumi-")))
    assert before["megatron-1.7b"] == now["megatron-1.7b"]  # no tensor parallelism; DP across nodes
    # the rows whose tensor-parallel calls are below the 256 MiB line, slower
    small = [
        r["id"] for r in DATA["run"] if r["id"] in now and r["tp"] > 1 and number[r["source"]] in (1, 4, 6)
    ]
    small = [i for i, size in zip(small, sizes) if size < 2**28]
    assert len(small) == 13 and all(now[k] > before[k] for k in small)


def test_the_history_of_the_mpt_runs_norms(monkeypatch):
    """The bullet before the last: the MPT runs' low-precision LayerNorm (16-bit norms under FSDP's bf16
    parameters: nothing cast but the logits); their rows and the table's figures, recomputed."""
    before_the_fsdp1_path(monkeypatch)
    products_at_the_matmul_rate(monkeypatch)
    text = " ".join(HISTORY.read_text().split())
    now = errors()
    stated = f"{mpt_rows(now)} {figures(now)}"
    assert stated in text, stated
    assert all(DATA["source"][k].get("norms") == "16-bit" for k in ("mpt-a100", "mpt-h100"))


def test_the_history_of_the_fsdp1_gradient_path(monkeypatch):
    """The bullet before the last: the MPT runs' FSDP1 gradient path counted; their rows and the table's
    figures, recomputed, the other rows unmoved and the MPT rows slower; and the bytes per element it
    quotes (traffic.fsdp1_gradient_bytes at 8 ranks, the MPT runs' bf16 gradients)."""
    before_the_lumi_log(monkeypatch)
    text = " ".join(HISTORY.read_text().split())
    now = errors()
    stated = f"{mpt_rows(now)} {figures(now)}"
    assert stated in text, stated
    whole = traffic.fsdp1_gradient_bytes(1, 0, 1, 2, 8)
    shard = traffic.fsdp1_gradient_bytes(0, 1, 1, 2, 8)
    later = traffic.fsdp1_gradient_bytes(0, 1, 2, 2, 8) - 2 * shard
    stated = f"per micro-batch {whole:g} bytes per element of the whole gradient and {shard:g} per element "
    stated += f"of the shard ({later:g} more from the second micro-batch on)"
    assert stated in text, stated
    assert {k for k, v in DATA["source"].items() if v.get("accumulation") == "fsdp1"} == {
        "mpt-a100",
        "mpt-h100",
    }
    before_the_fsdp1_path(monkeypatch)
    before = errors()
    assert all(before[k] == now[k] for k in now if not k.startswith("mpt-"))
    assert all(now[k] > before[k] for k in now if k.startswith("mpt-"))  # slower
