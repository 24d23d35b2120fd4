"""The validation table's inputs as docs/plan-validation.md took them on earlier days: each function puts
back one state of the data file (or of the model) that a history bullet of the page describes, so that the
bullet's figures can be recomputed. Each `before_*` state includes the ones after it in the page's order
(`before_the_fsdp1_path` is the data before the FSDP1 gradient path, and so before everything that came
later). Used by tests/unit/test_plan_validation_history.py and test_plan_validation_history_code.py."""

from __future__ import annotations

from exatrain.tools.plan import estimate
from tests.unit.test_plan_validation import (
    DATA,
    PAGE,
    _changed_rows,
    _korthikanti,
    _median_worst,
    _pipelined_megatron,
    _signed,
    rows,
)

# the MI250X's intra-node busbw the page took before the LUMI log's all-gathers were read: the Infinity Fabric
# bound between the two GCDs of one MI250X (an upper bound)
MI250X_LINK_BOUND = 200.0


# the data file's keys for the MPT runs' own code: Composer's optimizer step, llm-foundry's block,
# flash-attn's fused cross entropy
MPT_CODE = (("optimizer", "composer-adamw"), ("layer", "mpt"), ("loss", "xentropy"))


def _drop_source_keys(monkeypatch, drop) -> None:
    """Put back the sources without the keys `drop(key, value)` selects: the data file before a code fact
    was recorded."""
    sources = {k: {f: v for f, v in s.items() if not drop(f, v)} for k, s in DATA["source"].items()}
    monkeypatch.setitem(DATA, "source", sources)


def before_the_mpt_code(monkeypatch) -> None:
    """The sources as the page took them before the MPT runs' own code was counted (the last history
    bullet): a fused AdamW's step and exatrain's block for the MPT rows."""
    _drop_source_keys(monkeypatch, lambda f, v: (f, v) in MPT_CODE)


def before_the_megatron_layer(monkeypatch) -> None:
    """The sources as the page took them before the Megatron codes' own layer and BLOOM's ALiBi product were
    counted (the bullet before the last): exatrain's block for every run; and the MPT runs' code."""
    before_the_mpt_code(monkeypatch)
    _drop_source_keys(monkeypatch, lambda f, v: f in ("layer", "alibi"))


def before_the_dropout_branches(monkeypatch) -> None:
    """The sources as the page took them before the Megatron codes' dropout of the attention's output was
    counted (the bullet before the last): one dropout of the block's width per block, exatrain's; and
    exatrain's block."""
    before_the_megatron_layer(monkeypatch)
    _drop_source_keys(monkeypatch, lambda f, v: f == "dropout_branches")


def before_the_bf16_optimizer(monkeypatch) -> None:
    """The sources as the page took them before DeepSpeed's BF16_Optimizer step was counted (the bullet
    before the last): a fused AdamW over every parameter of the rank, and no gather after it, for [4] and
    [5]; and one dropout per block."""
    before_the_dropout_branches(monkeypatch)
    _drop_source_keys(monkeypatch, lambda f, v: (f, v) == ("optimizer", "deepspeed-bf16"))


def before_the_megatron_loss(monkeypatch) -> None:
    """The sources as the page took them before Megatron-LM's cross entropy was read (the bullet before the
    last): torch's cross entropy on logits gathered over the tensor-parallel ranks for every run; and no
    BF16_Optimizer step."""
    before_the_bf16_optimizer(monkeypatch)
    _drop_source_keys(monkeypatch, lambda f, v: f == "loss")


def before_the_ddp_copies(monkeypatch) -> None:
    """The data as the page had it before torch DDP's bucket copies were counted (the bullet before the
    last): no run's code charged for them; and torch's cross entropy for every run."""
    before_the_megatron_loss(monkeypatch)
    monkeypatch.setitem(DATA, "source", {k: dict(s, ddp="none") for k, s in DATA["source"].items()})
    monkeypatch.setitem(DATA, "run", [{f: v for f, v in r.items() if f != "ddp"} for r in DATA["run"]])


def before_the_megatron_optimizer(monkeypatch) -> None:
    """The sources as the page took them before the optimizer step of [1]'s code was counted (the bullet
    before the last): a fused AdamW's bytes for every run; and no DDP bucket copies."""
    before_the_ddp_copies(monkeypatch)
    _drop_source_keys(monkeypatch, lambda f, v: f == "optimizer")


def before_the_lumi_log(monkeypatch) -> None:
    """The data as the page had it before what the LUMI repository's 175B log shows was read (the bullet
    before the last): [4] and [5] sending whole tensors between pipeline stages, the MI250X's intra-node
    busbw at its link bound; and no optimizer of a published code's own."""
    before_the_megatron_optimizer(monkeypatch)
    _drop_source_keys(monkeypatch, lambda f, v: (f, v) == ("pipeline_sends", "partitioned"))
    machines = dict(DATA["hardware"])
    machines["mi250x-gcd"] = dict(machines["mi250x-gcd"], intra_node_busbw_gbs=MI250X_LINK_BOUND)
    monkeypatch.setitem(DATA, "hardware", machines)


def before_the_fsdp1_path(monkeypatch) -> None:
    """The sources as the page took them before 2026-11-28's FSDP1 gradient path of the MPT runs (the bullet
    before the last): no accumulation counted for their code; and the data before the LUMI log was read."""
    before_the_lumi_log(monkeypatch)
    _drop_source_keys(monkeypatch, lambda f, v: (f, v) == ("accumulation", "fsdp1"))


def busbw_without_curves(monkeypatch) -> None:
    """The machines as the page had them before 2026-11-28's busbw curves (the last history bullet): one
    busbw figure per machine, every collective at it whatever its size."""
    machines = {
        name: {k: v for k, v in hw.items() if not k.endswith("_curve")}
        for name, hw in DATA["hardware"].items()
    }
    monkeypatch.setitem(DATA, "hardware", machines)


def products_at_the_matmul_rate(monkeypatch) -> None:
    """The model as it was before 2026-11-28's roofline of the materialised attention's products (the
    bullet before the last): their FLOPs at matmul_tflops whatever bytes they move; and no busbw curves."""
    busbw_without_curves(monkeypatch)
    monkeypatch.setattr(
        estimate, "products_seconds", lambda flops, nbytes, hw: flops / (hw.matmul_tflops * 1e12)
    )


def without_accumulation() -> dict:
    """The sources as the page took them before the runs' own gradient accumulation was modelled
    (2026-11-28, the last history bullet): none counted for the published codes."""
    return {k: {f: v for f, v in s.items() if f != "accumulation"} for k, s in DATA["source"].items()}


def mpt_norms_in_fp32(sources: dict) -> dict:
    """The sources as the page took them before the MPT runs' low-precision LayerNorm was read (2026-11-28,
    the last history bullet): their norms on autocast's fp32 list, as exatrain's."""
    return {
        k: {f: v for f, v in s.items() if not (k.startswith("mpt-") and f == "norms")}
        for k, s in sources.items()
    }


def under_autocast() -> dict:
    """The sources as the page took them before the runs' own precision was modelled (2026-11-28, the
    bullet before the last): every code's activations under autocast, 16-bit weights or not, and no
    accumulation counted."""
    return {k: {f: v for f, v in s.items() if f != "norms"} for k, s in without_accumulation().items()}


def deepspeed_fp32_reduction() -> dict:
    """The sources as the page had them before 2026-11-28's correction: [4] and [5] with their gradients
    all-reduced in fp32 (DeepSpeed's engine casts them to bf16 on the wire: the data file), under autocast."""
    return {
        k: dict(v, gradients="fp32") if k in ("bloom", "lumi-scaling") else v
        for k, v in under_autocast().items()
    }


def mpt_rows(errors: dict[str, float]) -> str:
    """The MPT rows as the page lists them: "mpt A100 -22 %, ...; mpt H100 -37 %, ..."."""
    sizes = ("1b", "3b", "7b", "13b", "30b")
    a100 = ", ".join(_signed(errors[f"mpt-{size}-a100"]) for size in sizes)
    h100 = ", ".join(_signed(errors[f"mpt-{size}-h100"]) for size in ("1b", "7b", "13b", "30b"))
    return f"mpt A100 {a100}; mpt H100 {h100}"


# the page of the history bullets, beside docs/plan-validation.md
HISTORY = PAGE.with_name("plan-validation-history.md")


def errors() -> dict[str, float]:
    """Each run's error (predicted against measured) under the data as it stands: after a `before_*` state,
    the table of that day."""
    return {r["id"]: r["error"] for r in rows()}


def figures(errors: dict[str, float]) -> str:
    """The table's figures as a history bullet states them: "(over the 27 runs median 13 %, worst 38 %)"."""
    median, worst = _median_worst(errors)
    return f"(over the {len(errors)} runs median {median} %, worst {worst} %)"


def megatron_rows(errors: dict[str, float]) -> str:
    """The rows of the Megatron codes' runs as a history bullet lists them: those the page lists first
    (sources [1] without a pipeline, [4], [5]), then the pipelined rows of [1], then the rows of [6]."""
    return f"{_changed_rows(errors)}; {_pipelined_megatron(errors)}; {_korthikanti(errors)}"
