"""The history bullets of docs/plan-validation.md: each earlier state of the validation table, recomputed
under the treatment of its day (the sources as the page then took them), and the figures each bullet
states. The table itself, its readings and its inputs: tests/unit/test_plan_validation.py."""

from __future__ import annotations

import pytest

from exatrain.models import ModelShape
from exatrain.tools.plan import estimate, traffic
from tests.unit.test_plan_validation import (
    DATA,
    DATA_SHEETS,
    KORTHIKANTI,
    PAGE,
    PIPELINED_MEGATRON,
    _changed_rows,
    _errors_with_machines,
    _korthikanti,
    _median_worst,
    _pipelined_megatron,
    _signed,
    rows,
)


@pytest.fixture(scope="module")
def records():
    return rows()


# the MI250X's intra-node busbw the page took before the LUMI log's all-gathers were read: the Infinity Fabric
# bound between the two GCDs of one MI250X (an upper bound)
MI250X_LINK_BOUND = 200.0


# the data file's keys for the MPT runs' own code: Composer's optimizer step, llm-foundry's block,
# flash-attn's fused cross entropy
MPT_CODE = (("optimizer", "composer-adamw"), ("layer", "mpt"), ("loss", "xentropy"))


def _before_the_mpt_code(monkeypatch) -> None:
    """The sources as the page took them before the MPT runs' own code was counted (the last history
    bullet): a fused AdamW's step and exatrain's block for the MPT rows."""
    sources = {k: {f: v for f, v in s.items() if (f, v) not in MPT_CODE} for k, s in DATA["source"].items()}
    monkeypatch.setitem(DATA, "source", sources)


def _before_the_megatron_layer(monkeypatch) -> None:
    """The sources as the page took them before the Megatron codes' own layer and BLOOM's ALiBi product were
    counted (the bullet before the last): exatrain's block for every run; and the MPT runs' code."""
    _before_the_mpt_code(monkeypatch)
    sources = {
        k: {f: v for f, v in s.items() if f not in ("layer", "alibi")} for k, s in DATA["source"].items()
    }
    monkeypatch.setitem(DATA, "source", sources)


def _before_the_dropout_branches(monkeypatch) -> None:
    """The sources as the page took them before the Megatron codes' dropout of the attention's output was
    counted (the bullet before the last): one dropout of the block's width per block, exatrain's; and
    exatrain's block."""
    _before_the_megatron_layer(monkeypatch)
    sources = {k: {f: v for f, v in s.items() if f != "dropout_branches"} for k, s in DATA["source"].items()}
    monkeypatch.setitem(DATA, "source", sources)


def _before_the_bf16_optimizer(monkeypatch) -> None:
    """The sources as the page took them before DeepSpeed's BF16_Optimizer step was counted (the bullet
    before the last): a fused AdamW over every parameter of the rank, and no gather after it, for [4] and
    [5]; and one dropout per block."""
    _before_the_dropout_branches(monkeypatch)
    sources = {
        k: {f: v for f, v in s.items() if not (f == "optimizer" and v == "deepspeed-bf16")}
        for k, s in DATA["source"].items()
    }
    monkeypatch.setitem(DATA, "source", sources)


def _before_the_megatron_loss(monkeypatch) -> None:
    """The sources as the page took them before Megatron-LM's cross entropy was read (the bullet before the
    last): torch's cross entropy on logits gathered over the tensor-parallel ranks for every run; and no
    BF16_Optimizer step."""
    _before_the_bf16_optimizer(monkeypatch)
    sources = {k: {f: v for f, v in s.items() if f != "loss"} for k, s in DATA["source"].items()}
    monkeypatch.setitem(DATA, "source", sources)


def _before_the_ddp_copies(monkeypatch) -> None:
    """The data as the page had it before torch DDP's bucket copies were counted (the bullet before the
    last): no run's code charged for them; and torch's cross entropy for every run."""
    _before_the_megatron_loss(monkeypatch)
    monkeypatch.setitem(DATA, "source", {k: dict(s, ddp="none") for k, s in DATA["source"].items()})
    monkeypatch.setitem(DATA, "run", [{f: v for f, v in r.items() if f != "ddp"} for r in DATA["run"]])


def _before_the_megatron_optimizer(monkeypatch) -> None:
    """The sources as the page took them before the optimizer step of [1]'s code was counted (the bullet
    before the last): a fused AdamW's bytes for every run; and no DDP bucket copies."""
    _before_the_ddp_copies(monkeypatch)
    sources = {k: {f: v for f, v in s.items() if f != "optimizer"} for k, s in DATA["source"].items()}
    monkeypatch.setitem(DATA, "source", sources)


def _before_the_lumi_log(monkeypatch) -> None:
    """The data as the page had it before what the LUMI repository's 175B log shows was read (the bullet
    before the last): [4] and [5] sending whole tensors between pipeline stages, the MI250X's intra-node
    busbw at its link bound; and no optimizer of a published code's own."""
    _before_the_megatron_optimizer(monkeypatch)
    sources = {
        k: {f: v for f, v in s.items() if not (f == "pipeline_sends" and v == "partitioned")}
        for k, s in DATA["source"].items()
    }
    monkeypatch.setitem(DATA, "source", sources)
    machines = dict(DATA["hardware"])
    machines["mi250x-gcd"] = dict(machines["mi250x-gcd"], intra_node_busbw_gbs=MI250X_LINK_BOUND)
    monkeypatch.setitem(DATA, "hardware", machines)


def _before_the_fsdp1_path(monkeypatch) -> None:
    """The sources as the page took them before 2026-11-28's FSDP1 gradient path of the MPT runs (the bullet
    before the last): no accumulation counted for their code; and the data before the LUMI log was read."""
    _before_the_lumi_log(monkeypatch)
    sources = {
        k: {f: v for f, v in s.items() if not (f == "accumulation" and v == "fsdp1")}
        for k, s in DATA["source"].items()
    }
    monkeypatch.setitem(DATA, "source", sources)


def _busbw_without_curves(monkeypatch) -> None:
    """The machines as the page had them before 2026-11-28's busbw curves (the last history bullet): one
    busbw figure per machine, every collective at it whatever its size."""
    machines = {
        name: {k: v for k, v in hw.items() if not k.endswith("_curve")}
        for name, hw in DATA["hardware"].items()
    }
    monkeypatch.setitem(DATA, "hardware", machines)


def _products_at_the_matmul_rate(monkeypatch) -> None:
    """The model as it was before 2026-11-28's roofline of the materialised attention's products (the
    bullet before the last): their FLOPs at matmul_tflops whatever bytes they move; and no busbw curves."""
    _busbw_without_curves(monkeypatch)
    monkeypatch.setattr(
        estimate, "products_seconds", lambda flops, nbytes, hw: flops / (hw.matmul_tflops * 1e12)
    )


def _without_accumulation() -> dict:
    """The sources as the page took them before the runs' own gradient accumulation was modelled
    (2026-11-28, the last history bullet): none counted for the published codes."""
    return {k: {f: v for f, v in s.items() if f != "accumulation"} for k, s in DATA["source"].items()}


def _mpt_norms_in_fp32(sources: dict) -> dict:
    """The sources as the page took them before the MPT runs' low-precision LayerNorm was read (2026-11-28,
    the last history bullet): their norms on autocast's fp32 list, as exatrain's."""
    return {
        k: {f: v for f, v in s.items() if not (k.startswith("mpt-") and f == "norms")}
        for k, s in sources.items()
    }


def _under_autocast() -> dict:
    """The sources as the page took them before the runs' own precision was modelled (2026-11-28, the
    bullet before the last): every code's activations under autocast, 16-bit weights or not, and no
    accumulation counted."""
    return {k: {f: v for f, v in s.items() if f != "norms"} for k, s in _without_accumulation().items()}


def _deepspeed_fp32_reduction() -> dict:
    """The sources as the page had them before 2026-11-28's correction: [4] and [5] with their gradients
    all-reduced in fp32 (DeepSpeed's engine casts them to bf16 on the wire: the data file), under autocast."""
    return {
        k: dict(v, gradients="fp32") if k in ("bloom", "lumi-scaling") else v
        for k, v in _under_autocast().items()
    }


def test_the_history_of_the_runs_own_settings_and_measured_constants(monkeypatch):
    """The history bullet of 2026-11-28, over the 17 runs the table then had (the runs' own code settings,
    then measured constants): the table before (for [1] micro batch 1, gradients reduced after the
    backward and fp32 weights, for [4] and [5] fp32 weights; data sheets), with the code settings alone, and
    with the measured constants, each recomputed; then the pipelined rows of [1] added (23 runs). [4] and
    [5] as the page then took them: gradients all-reduced in fp32 (corrected in the next bullet)."""
    _before_the_fsdp1_path(monkeypatch)
    _products_at_the_matmul_rate(monkeypatch)
    text = " ".join(PAGE.read_text().split())
    added = {f"megatron-{size}" for size in PIPELINED_MEGATRON} | {f"korthikanti-{s}" for s in KORTHIKANTI}
    monkeypatch.setitem(DATA, "source", _deepspeed_fp32_reduction())
    monkeypatch.setitem(DATA, "run", [r for r in DATA["run"] if not r["id"].startswith("korthikanti-")])
    now = {r["id"]: r["error"] for r in rows()}
    seventeen = [r for r in DATA["run"] if r["id"] not in added]
    assert len(seventeen) == 17
    monkeypatch.setitem(DATA, "run", seventeen)
    constants = {r["id"]: r["error"] for r in rows()}
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
    _before_the_fsdp1_path(monkeypatch)
    _products_at_the_matmul_rate(monkeypatch)
    text = " ".join(PAGE.read_text().split())
    monkeypatch.setitem(DATA, "source", _under_autocast())
    now = {r["id"]: r["error"] for r in rows()}
    monkeypatch.setitem(DATA, "run", [r for r in DATA["run"] if not r["id"].startswith("korthikanti-")])
    corrected = {r["id"]: r["error"] for r in rows()}
    lumi = ", ".join(_signed(corrected[f"lumi-{size}"]) for size in ("7b", "33b", "175b"))
    median, worst = _median_worst(corrected)
    stated = (
        f"bloom-176b {_signed(corrected['bloom-176b'])}; lumi {lumi} (median {median} %, worst {worst} %)"
    )
    assert len(corrected) == 23 and stated in text, stated
    median, worst = _median_worst(now)
    stated = f"{_korthikanti(now)} (over the {len(now)} runs median {median} %, worst {worst} %)"
    assert stated in text, stated


def test_the_history_of_the_runs_own_precision(monkeypatch):
    """The bullet before the last: the codes of [1], [4], [5] and [6] without autocast (Code.autocast
    False: 16-bit norms, no activation casts); the rows it moved and the table's figures then, recomputed
    (no accumulation counted for the published codes)."""
    _before_the_fsdp1_path(monkeypatch)
    _products_at_the_matmul_rate(monkeypatch)
    text = " ".join(PAGE.read_text().split())
    monkeypatch.setitem(DATA, "source", _mpt_norms_in_fp32(_without_accumulation()))
    now = {r["id"]: r["error"] for r in rows()}
    median, worst = _median_worst(now)
    stated = (
        f"{_changed_rows(now)}; {_pipelined_megatron(now)}; {_korthikanti(now)} (over the {len(now)} runs "
        f"median {median} %, worst {worst} %)"
    )
    assert stated in text, stated
    sixteen = {
        k for k, v in DATA["source"].items() if v.get("weights") == "16-bit" and v.get("norms") == "16-bit"
    }
    assert sixteen == {"narayanan2021", "bloom", "lumi-scaling", "korthikanti2022"}


def test_the_history_of_the_runs_own_accumulation(monkeypatch):
    """The bullet before the last: the gradient accumulation of the codes of [1] (16-bit main_grad adds)
    and of [4] and [5] (DeepSpeed's bf16 optimizer) counted; the rows it moved and the table's figures then
    (the MPT runs' norms in fp32)."""
    _before_the_fsdp1_path(monkeypatch)
    _products_at_the_matmul_rate(monkeypatch)
    text = " ".join(PAGE.read_text().split())
    monkeypatch.setitem(DATA, "source", _mpt_norms_in_fp32(DATA["source"]))
    now = {r["id"]: r["error"] for r in rows()}
    median, worst = _median_worst(now)
    stated = f"{_changed_rows(now)}; {_pipelined_megatron(now)} (over the {len(now)} runs median {median} %, "
    stated += f"worst {worst} %)"
    assert stated in text, stated
    ways = {k: v["accumulation"] for k, v in DATA["source"].items() if "accumulation" in v}
    assert ways == {
        "narayanan2021": "16-bit",
        "bloom": "deepspeed-bf16",
        "lumi-scaling": "deepspeed-bf16",
        "exatrain-h100": "autograd",
        "exatrain-h200": "autograd",
    }


def _mpt_rows(errors: dict[str, float]) -> str:
    """The MPT rows as the page lists them: "mpt A100 -22 %, ...; mpt H100 -37 %, ..."."""
    sizes = ("1b", "3b", "7b", "13b", "30b")
    a100 = ", ".join(_signed(errors[f"mpt-{size}-a100"]) for size in sizes)
    h100 = ", ".join(_signed(errors[f"mpt-{size}-h100"]) for size in ("1b", "7b", "13b", "30b"))
    return f"mpt A100 {a100}; mpt H100 {h100}"


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
    _before_the_fsdp1_path(monkeypatch)
    _busbw_without_curves(monkeypatch)
    text = " ".join(PAGE.read_text().split())
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
    now = {r["id"]: r["error"] for r in rows()}
    median, worst = _median_worst(now)
    stated = (
        f"{_changed_rows(now)}; {_pipelined_megatron(now)}; {_korthikanti(now)} (over the {len(now)} runs "
    )
    stated += f"median {median} %, worst {worst} %)"
    assert stated in text, stated
    kept = {k for k, v in DATA["source"].items() if v.get("attention") == "materialised"}
    assert kept == {"narayanan2021", "bloom", "lumi-scaling", "korthikanti2022"}
    _products_at_the_matmul_rate(monkeypatch)
    before = {r["id"]: r["error"] for r in rows()}
    assert all(before[k] == now[k] for k in now if k.startswith("lumi-"))
    assert all(
        now[k] > before[k] for k in now if k.startswith(("megatron-", "korthikanti-", "bloom-"))
    )  # slower


def test_the_history_of_the_busbw_curves(monkeypatch):
    """The bullet before the last: the A100 and H100 collectives at their own size's busbw; the rows it
    moved, the table's figures, and the rows it did not move (MPT, LUMI), recomputed."""
    _before_the_fsdp1_path(monkeypatch)
    text = " ".join(PAGE.read_text().split())
    now = {r["id"]: r["error"] for r in rows()}
    median, worst = _median_worst(now)
    stated = (
        f"{_changed_rows(now)}; {_pipelined_megatron(now)}; {_korthikanti(now)} (over the {len(now)} runs "
    )
    stated += f"median {median} %, worst {worst} %)"
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
    _busbw_without_curves(monkeypatch)
    before = {r["id"]: r["error"] for r in rows()}
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
    _before_the_fsdp1_path(monkeypatch)
    _products_at_the_matmul_rate(monkeypatch)
    text = " ".join(PAGE.read_text().split())
    now = {r["id"]: r["error"] for r in rows()}
    median, worst = _median_worst(now)
    stated = f"{_mpt_rows(now)} (over the {len(now)} runs median {median} %, worst {worst} %)"
    assert stated in text, stated
    assert all(DATA["source"][k].get("norms") == "16-bit" for k in ("mpt-a100", "mpt-h100"))


def test_the_history_of_the_fsdp1_gradient_path(monkeypatch):
    """The bullet before the last: the MPT runs' FSDP1 gradient path counted; their rows and the table's
    figures, recomputed, the other rows unmoved and the MPT rows slower; and the bytes per element it
    quotes (traffic.fsdp1_gradient_bytes at 8 ranks, the MPT runs' bf16 gradients)."""
    _before_the_lumi_log(monkeypatch)
    text = " ".join(PAGE.read_text().split())
    now = {r["id"]: r["error"] for r in rows()}
    median, worst = _median_worst(now)
    stated = f"{_mpt_rows(now)} (over the {len(now)} runs median {median} %, worst {worst} %)"
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
    _before_the_fsdp1_path(monkeypatch)
    before = {r["id"]: r["error"] for r in rows()}
    assert all(before[k] == now[k] for k in now if not k.startswith("mpt-"))
    assert all(now[k] > before[k] for k in now if k.startswith("mpt-"))  # slower


def test_the_history_of_the_lumi_log(monkeypatch):
    """The bullet before the last: DeepSpeed's partitioned pipeline sends for [4] and [5], then the MI250X's
    intra-node busbw from the LUMI log's all-gathers; the rows each moved and the table's figures,
    recomputed, and the rows they did not move."""
    _before_the_megatron_optimizer(monkeypatch)
    text = " ".join(PAGE.read_text().split())
    now = {r["id"]: r["error"] for r in rows()}
    assert {k for k, v in DATA["source"].items() if v.get("pipeline_sends") == "partitioned"} == {
        "bloom",
        "lumi-scaling",
    }
    sources = dict(DATA["source"])
    _before_the_lumi_log(monkeypatch)
    before = {r["id"]: r["error"] for r in rows()}
    monkeypatch.setitem(DATA, "source", sources)  # the partitioned sends alone, at the former busbw
    sends = {r["id"]: r["error"] for r in rows()}
    moved = ("bloom-176b", "lumi-33b", "lumi-175b")
    assert all(before[k] == sends[k] == now[k] for k in now if k not in moved)
    assert all(sends[k] < before[k] for k in moved)  # smaller sends across nodes: faster
    assert (
        all(now[k] > sends[k] for k in ("lumi-33b", "lumi-175b")) and now["bloom-176b"] == sends["bloom-176b"]
    )
    stated = (
        f"bloom-176b {_signed(before['bloom-176b'])} to {_signed(sends['bloom-176b'])}, lumi-175b "
        f"{_signed(before['lumi-175b'])} to {_signed(sends['lumi-175b'])}, lumi-33b "
        f"{before['lumi-33b'] * 100:.1f} % to {sends['lumi-33b'] * 100:.1f} %"
    )
    assert stated in text, stated
    stated = (
        f"lumi-33b {_signed(sends['lumi-33b'])} to {_signed(now['lumi-33b'])}, lumi-175b "
        f"{_signed(sends['lumi-175b'])} to {_signed(now['lumi-175b'])} (lumi-7b, without tensor "
        f"parallelism, stays {_signed(now['lumi-7b'])})"
    )
    assert stated in text, stated
    median, worst = _median_worst(now)
    assert f"Over the {len(now)} runs median {median} %, worst {worst} %" in text
    assert _median_worst(before) == (12, 39)  # the bullet before states these


def test_the_history_of_the_megatron_optimizer(monkeypatch):
    """The bullet before the last: Megatron-LM's fp16 optimizer step counted for the runs of [1]; their rows
    and the table's figures, recomputed, the other rows unmoved and the rows of [1] slower."""
    _before_the_ddp_copies(monkeypatch)
    text = " ".join(PAGE.read_text().split())
    now = {r["id"]: r["error"] for r in rows()}
    median, worst = _median_worst(now)
    stated = f"{_changed_rows(now)}; {_pipelined_megatron(now)} (over the {len(now)} runs median {median} %, "
    stated += f"worst {worst} %)"
    assert stated in text, stated
    assert {k for k, v in DATA["source"].items() if "optimizer" in v} == {"narayanan2021"}
    extra = estimate.OPTIMIZER_BYTES["megatron-fp16"] - estimate.OPTIMIZER_BYTES["adamw"]
    assert (
        f"{extra} bytes per parameter element more than a fused AdamW's {estimate.OPTIMIZER_BYTES['adamw']}"
        in text
    )
    _before_the_megatron_optimizer(monkeypatch)
    before = {r["id"]: r["error"] for r in rows()}
    assert all(before[k] == now[k] for k in now if not k.startswith("megatron-"))
    assert all(now[k] > before[k] for k in now if k.startswith("megatron-"))  # slower


def test_the_history_of_the_ddp_copies(monkeypatch):
    """The bullet before the last: torch DDP's bucket copies counted, for the rows of [1] without a pipeline
    (DDP=torch); their rows and the table's figures, recomputed, the other rows unmoved, those four slower."""
    _before_the_megatron_loss(monkeypatch)
    text = " ".join(PAGE.read_text().split())
    now = {r["id"]: r["error"] for r in rows()}
    median, worst = _median_worst(now)
    torch_ddp = {r["id"] for r in DATA["run"] if r["source"] == "narayanan2021" and r.get("pp", 1) == 1}
    rows_ = ", ".join(f"{i} {now[i] * 100:.1f} %" for i in sorted(torch_ddp, key=lambda i: float(i[9:-1])))
    stated = f"{rows_} (over the {len(now)} runs median {median} %, worst {worst} %)"
    assert stated in text, stated
    _before_the_ddp_copies(monkeypatch)
    before = {r["id"]: r["error"] for r in rows()}
    assert all(before[k] == now[k] for k in now if k not in torch_ddp)
    assert all(now[k] > before[k] for k in torch_ddp)  # slower


def test_the_history_of_the_megatron_loss(monkeypatch):
    """The third bullet from the end: Megatron-LM's vocab-parallel cross entropy for the runs of [1], [4], [5]
    and [6]; their rows and the table's figures, recomputed. The MPT rows do not move; rows without tensor
    parallelism are slower (the loss's in-place ops move more bytes than torch's), rows with it faster (no
    gather of the logits, the loss on 1/TP of them)."""
    _before_the_bf16_optimizer(monkeypatch)
    text = " ".join(PAGE.read_text().split())
    now = {r["id"]: r["error"] for r in rows()}
    median, worst = _median_worst(now)
    stated = f"{_changed_rows(now)}; {_pipelined_megatron(now)}; {_korthikanti(now)} (over the {len(now)} "
    stated += f"runs median {median} %, worst {worst} %)"
    assert stated in text, stated
    megatron = {k for k, v in DATA["source"].items() if "loss" in v}
    assert megatron == {"narayanan2021", "korthikanti2022", "bloom", "lumi-scaling"}
    _before_the_megatron_loss(monkeypatch)
    before = {r["id"]: r["error"] for r in rows()}
    for run in DATA["run"]:
        i = run["id"]
        if run["source"] not in megatron:
            assert before[i] == now[i], i
        elif run["tp"] == 1:
            assert now[i] > before[i], i  # slower
        else:
            assert now[i] < before[i], i  # faster


def test_the_history_of_the_bf16_optimizer(monkeypatch):
    """The bullet before the last: DeepSpeed's BF16_Optimizer step for the runs of [4] and [5] (its reads and
    writes, and its all-gather of the parameters after the step); their rows and the table's figures,
    recomputed. The other rows do not move; those four are slower (the gather is exposed; the update of a
    1/DP partition moves fewer bytes than a fused AdamW over all, which does not make up for it)."""
    _before_the_dropout_branches(monkeypatch)
    text = " ".join(PAGE.read_text().split())
    now = {r["id"]: r["error"] for r in rows()}
    median, worst = _median_worst(now)
    bf16 = {k for k, v in DATA["source"].items() if v.get("optimizer") == "deepspeed-bf16"}
    assert bf16 == {"bloom", "lumi-scaling"}
    ids = [r["id"] for r in DATA["run"] if r["source"] in bf16]
    stated = ", ".join(f"{i} {now[i] * 100:.1f} %" for i in ids)
    stated += f" (over the {len(now)} runs median {median} %, worst {worst} %)"
    assert stated in text, stated
    _before_the_bf16_optimizer(monkeypatch)
    before = {r["id"]: r["error"] for r in rows()}
    for i in now:
        if i in ids:
            assert now[i] > before[i], i  # slower
        else:
            assert now[i] == before[i], i


def test_the_history_of_the_dropout_branches(monkeypatch):
    """The bullet before the last: the Megatron codes ([1], [4], [5], [6]) drop out the attention's output
    too; their rows and the table's figures, recomputed. The MPT rows (no dropout) do not move; those runs
    are all slower."""
    _before_the_megatron_layer(monkeypatch)
    text = " ".join(PAGE.read_text().split())
    now = {r["id"]: r["error"] for r in rows()}
    median, worst = _median_worst(now)
    stated = f"{_changed_rows(now)}; {_pipelined_megatron(now)}; {_korthikanti(now)} (over the {len(now)} "
    stated += f"runs median {median} %, worst {worst} %)"
    assert stated in text, stated
    both = {k for k, v in DATA["source"].items() if v.get("dropout_branches") == 2}
    assert both == {"narayanan2021", "korthikanti2022", "bloom", "lumi-scaling"}
    _before_the_dropout_branches(monkeypatch)
    before = {r["id"]: r["error"] for r in rows()}
    for run in DATA["run"]:
        i = run["id"]
        assert (now[i] > before[i]) if run["source"] in both else (now[i] == before[i]), i


def test_the_history_of_the_megatron_layer(monkeypatch):
    """The history bullet before the last: the Megatron codes' own layer ([1], [4], [5], [6]: its split, copy
    and bias gradients, its reentrant checkpoint) and the ALiBi product of BLOOM's code ([4], [5]); their rows
    and the table's figures, recomputed. The MPT rows do not move; the others are all slower."""
    text = " ".join(PAGE.read_text().split())
    _before_the_mpt_code(monkeypatch)
    now = {r["id"]: r["error"] for r in rows()}
    median, worst = _median_worst(now)
    stated = f"{_changed_rows(now)}; {_pipelined_megatron(now)}; {_korthikanti(now)} (over the {len(now)} "
    stated += f"runs median {median} %, worst {worst} %)"
    assert stated in text, stated
    megatron = {k for k, v in DATA["source"].items() if v.get("layer") == "megatron"}
    alibi = {k for k, v in DATA["source"].items() if v.get("alibi") == "baddbmm"}
    assert megatron == {"narayanan2021", "korthikanti2022", "bloom", "lumi-scaling"}
    assert alibi == {"bloom", "lumi-scaling"}
    _before_the_megatron_layer(monkeypatch)
    before = {r["id"]: r["error"] for r in rows()}
    for run in DATA["run"]:
        i = run["id"]
        assert (now[i] > before[i]) if run["source"] in megatron else (now[i] == before[i]), i


def test_the_history_of_the_mpt_code(monkeypatch, records):
    """The last history bullet: the MPT runs' own code ([2], [3]: Composer's DecoupledAdamW and FSDP1's
    clipping, llm-foundry's MPTBlock, flash-attn's fused cross entropy); their rows, the table's figures and
    how far they moved, recomputed. Only the MPT rows move."""
    text = " ".join(PAGE.read_text().split())
    now = {r["id"]: r["error"] for r in records}
    median, worst = _median_worst(now)
    mpt = {"mpt-a100", "mpt-h100"}
    for key, value in MPT_CODE:
        assert {k for k, v in DATA["source"].items() if v.get(key) == value} == mpt, key
    _before_the_mpt_code(monkeypatch)
    before = {r["id"]: r["error"] for r in rows()}
    moved = {}
    for run in DATA["run"]:
        i = run["id"]
        if run["source"] in mpt:
            moved[i] = 100 * (now[i] - before[i])
        else:
            assert now[i] == before[i], i
    most, least = max(moved, key=moved.get), min(moved, key=moved.get)
    worst_row = max(now, key=lambda i: abs(now[i]))
    stated = f"move them by {moved[least]:+.1f} to {moved[most]:+.1f} points, {most} the most (one"
    stated += (
        " micro-batch of 2 x 2048 tokens per GPU and step, against which the optimizer step weighs most) and "
    )
    stated += f"{least} the least (its loss saves what the rest adds): {_mpt_rows(now)} (over the "
    stated += f"{len(now)} runs median {median} %, worst {worst} %, now {worst_row})"
    assert stated in text, stated
    run = next(r for r in DATA["run"] if r["id"] == most)
    assert run["global_batch"] == run["micro_batch"] * run["gpus"]
    assert run["micro_batch"] * run["seq_len"] == 4096
