"""The history bullets of docs/plan-validation-history.md from the LUMI log on (2026-11-28 to 2026-12-07),
each a fact read in the published runs' own code or logs: the table before and after it, recomputed (the
sources as the page then took them, tests/unit/plan_validation_past.py), the rows it moved and the figures the
bullet states. The earlier bullets: tests/unit/test_plan_validation_history.py."""

from __future__ import annotations

import pytest

from exatrain.tools.plan import estimate
from tests.unit.plan_validation_past import (
    HISTORY,
    MPT_CODE,
    before_the_bf16_optimizer,
    before_the_ddp_copies,
    before_the_dropout_branches,
    before_the_lumi_log,
    before_the_megatron_layer,
    before_the_megatron_loss,
    before_the_megatron_optimizer,
    before_the_mpt_code,
    errors,
    figures,
    megatron_rows,
    mpt_rows,
)
from tests.unit.test_plan_validation import (
    DATA,
    _changed_rows,
    _median_worst,
    _pipelined_megatron,
    _signed,
    rows,
)


@pytest.fixture(scope="module")
def records():
    return rows()


def test_the_history_of_the_lumi_log(monkeypatch):
    """The bullet before the last: DeepSpeed's partitioned pipeline sends for [4] and [5], then the MI250X's
    intra-node busbw from the LUMI log's all-gathers; the rows each moved and the table's figures,
    recomputed, and the rows they did not move."""
    before_the_megatron_optimizer(monkeypatch)
    text = " ".join(HISTORY.read_text().split())
    now = errors()
    assert {k for k, v in DATA["source"].items() if v.get("pipeline_sends") == "partitioned"} == {
        "bloom",
        "lumi-scaling",
    }
    sources = dict(DATA["source"])
    before_the_lumi_log(monkeypatch)
    before = errors()
    monkeypatch.setitem(DATA, "source", sources)  # the partitioned sends alone, at the former busbw
    sends = errors()
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
    before_the_ddp_copies(monkeypatch)
    text = " ".join(HISTORY.read_text().split())
    now = errors()
    stated = f"{_changed_rows(now)}; {_pipelined_megatron(now)} {figures(now)}"
    assert stated in text, stated
    assert {k for k, v in DATA["source"].items() if "optimizer" in v} == {"narayanan2021"}
    extra = estimate.OPTIMIZER_BYTES["megatron-fp16"] - estimate.OPTIMIZER_BYTES["adamw"]
    assert (
        f"{extra} bytes per parameter element more than a fused AdamW's {estimate.OPTIMIZER_BYTES['adamw']}"
        in text
    )
    before_the_megatron_optimizer(monkeypatch)
    before = errors()
    assert all(before[k] == now[k] for k in now if not k.startswith("megatron-"))
    assert all(now[k] > before[k] for k in now if k.startswith("megatron-"))  # slower


def test_the_history_of_the_ddp_copies(monkeypatch):
    """The bullet before the last: torch DDP's bucket copies counted, for the rows of [1] without a pipeline
    (DDP=torch); their rows and the table's figures, recomputed, the other rows unmoved, those four slower."""
    before_the_megatron_loss(monkeypatch)
    text = " ".join(HISTORY.read_text().split())
    now = errors()
    torch_ddp = {r["id"] for r in DATA["run"] if r["source"] == "narayanan2021" and r.get("pp", 1) == 1}
    rows_ = ", ".join(f"{i} {now[i] * 100:.1f} %" for i in sorted(torch_ddp, key=lambda i: float(i[9:-1])))
    stated = f"{rows_} {figures(now)}"
    assert stated in text, stated
    before_the_ddp_copies(monkeypatch)
    before = errors()
    assert all(before[k] == now[k] for k in now if k not in torch_ddp)
    assert all(now[k] > before[k] for k in torch_ddp)  # slower


def test_the_history_of_the_megatron_loss(monkeypatch):
    """The third bullet from the end: Megatron-LM's vocab-parallel cross entropy for the runs of [1], [4], [5]
    and [6]; their rows and the table's figures, recomputed. The MPT rows do not move; rows without tensor
    parallelism are slower (the loss's in-place ops move more bytes than torch's), rows with it faster (no
    gather of the logits, the loss on 1/TP of them)."""
    before_the_bf16_optimizer(monkeypatch)
    text = " ".join(HISTORY.read_text().split())
    now = errors()
    stated = f"{megatron_rows(now)} {figures(now)}"
    assert stated in text, stated
    megatron = {k for k, v in DATA["source"].items() if "loss" in v}
    assert megatron == {"narayanan2021", "korthikanti2022", "bloom", "lumi-scaling"}
    before_the_megatron_loss(monkeypatch)
    before = errors()
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
    before_the_dropout_branches(monkeypatch)
    text = " ".join(HISTORY.read_text().split())
    now = errors()
    bf16 = {k for k, v in DATA["source"].items() if v.get("optimizer") == "deepspeed-bf16"}
    assert bf16 == {"bloom", "lumi-scaling"}
    ids = [r["id"] for r in DATA["run"] if r["source"] in bf16]
    stated = ", ".join(f"{i} {now[i] * 100:.1f} %" for i in ids)
    stated += f" {figures(now)}"
    assert stated in text, stated
    before_the_bf16_optimizer(monkeypatch)
    before = errors()
    for i in now:
        if i in ids:
            assert now[i] > before[i], i  # slower
        else:
            assert now[i] == before[i], i


def test_the_history_of_the_dropout_branches(monkeypatch):
    """The bullet before the last: the Megatron codes ([1], [4], [5], [6]) drop out the attention's output
    too; their rows and the table's figures, recomputed. The MPT rows (no dropout) do not move; those runs
    are all slower."""
    before_the_megatron_layer(monkeypatch)
    text = " ".join(HISTORY.read_text().split())
    now = errors()
    stated = f"{megatron_rows(now)} {figures(now)}"
    assert stated in text, stated
    both = {k for k, v in DATA["source"].items() if v.get("dropout_branches") == 2}
    assert both == {"narayanan2021", "korthikanti2022", "bloom", "lumi-scaling"}
    before_the_dropout_branches(monkeypatch)
    before = errors()
    for run in DATA["run"]:
        i = run["id"]
        assert (now[i] > before[i]) if run["source"] in both else (now[i] == before[i]), i


def test_the_history_of_the_megatron_layer(monkeypatch):
    """The history bullet before the last: the Megatron codes' own layer ([1], [4], [5], [6]: its split, copy
    and bias gradients, its reentrant checkpoint) and the ALiBi product of BLOOM's code ([4], [5]); their rows
    and the table's figures, recomputed. The MPT rows do not move; the others are all slower."""
    text = " ".join(HISTORY.read_text().split())
    before_the_mpt_code(monkeypatch)
    now = errors()
    stated = f"{megatron_rows(now)} {figures(now)}"
    assert stated in text, stated
    megatron = {k for k, v in DATA["source"].items() if v.get("layer") == "megatron"}
    alibi = {k for k, v in DATA["source"].items() if v.get("alibi") == "baddbmm"}
    assert megatron == {"narayanan2021", "korthikanti2022", "bloom", "lumi-scaling"}
    assert alibi == {"bloom", "lumi-scaling"}
    before_the_megatron_layer(monkeypatch)
    before = errors()
    for run in DATA["run"]:
        i = run["id"]
        assert (now[i] > before[i]) if run["source"] in megatron else (now[i] == before[i]), i


def test_the_history_of_the_mpt_code(monkeypatch, records):
    """The last history bullet: the MPT runs' own code ([2], [3]: Composer's DecoupledAdamW and FSDP1's
    clipping, llm-foundry's MPTBlock, flash-attn's fused cross entropy); their rows, the table's figures and
    how far they moved, recomputed. Only the MPT rows move."""
    text = " ".join(HISTORY.read_text().split())
    now = {r["id"]: r["error"] for r in records}
    median, worst = _median_worst(now)
    mpt = {"mpt-a100", "mpt-h100"}
    for key, value in MPT_CODE:
        assert {k for k, v in DATA["source"].items() if v.get(key) == value} == mpt, key
    before_the_mpt_code(monkeypatch)
    before = errors()
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
    stated += f"{least} the least (its loss saves what the rest adds): {mpt_rows(now)} (over the "
    stated += f"{len(now)} runs median {median} %, worst {worst} %, now {worst_row})"
    assert stated in text, stated
    run = next(r for r in DATA["run"] if r["id"] == most)
    assert run["global_batch"] == run["micro_batch"] * run["gpus"]
    assert run["micro_batch"] * run["seq_len"] == 4096
