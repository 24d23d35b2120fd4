"""TensorBoard event files written by exatrain, read back with TensorBoard's own EventAccumulator."""

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from exatrain.errors import ExatrainError
from exatrain.observe import tensorboard as tb
from exatrain.observe.metrics import MetricsFanout, MetricsLog, read_metrics


def read_scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} of every scalar series under log_dir (TensorBoard's reader)."""
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_records_become_scalar_series(tmp_path):
    log = MetricsFanout(
        MetricsLog(tmp_path / "metrics.jsonl", enabled=True), tb.TensorBoardLog(tmp_path / "tb")
    )
    log.write(kind="train", step=1, loss=4.5, mfu=None, tokens_per_s=1000.0, slowest_rank=1)
    log.write(kind="train", step=2, loss=3.25, mfu=None, tokens_per_s=1200.0, slowest_rank=0)
    log.write(kind="eval", step=2, loss=3.5, perplexity=33.1)
    log.close()
    scalars = read_scalars(tmp_path / "tb")
    assert scalars["train/loss"] == [(1, 4.5), (2, 3.25)]
    assert scalars["train/tokens_per_s"] == [(1, 1000.0), (2, 1200.0)]
    assert scalars["train/slowest_rank"] == [(1, 1.0), (2, 0.0)]
    assert scalars["eval/perplexity"] == [(2, pytest.approx(33.1))]
    assert "train/mfu" not in scalars  # None (no peak FLOP/s on CPU) is left out, not written as 0
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 3


def test_tensorboard_setting(monkeypatch):
    assert tb.wants_tensorboard("off") is False
    assert tb.wants_tensorboard("auto") is True  # tensorboard is a dependency of exatrain
    monkeypatch.setattr(tb, "tensorboard_available", lambda: False)
    assert tb.wants_tensorboard("auto") is False
    with pytest.raises(ExatrainError, match="HINT: pip install tensorboard \\(a dependency of exatrain"):
        tb.wants_tensorboard("on")
    with pytest.raises(ExatrainError, match="observe.tensorboard='yes'"):
        tb.wants_tensorboard("yes")


def test_a_flagged_straggler_is_a_text_entry(tmp_path):
    """The record that flags a straggler (StepMetrics' straggler_flagged) also goes to TensorBoard's Text
    tab."""
    log = tb.TensorBoardLog(tmp_path / "tb")
    flag = {"rank": 1, "host": "nid005012", "device": "GPU 3", "phase": "data", "ratio": 1.52, "intervals": 3}
    log.write(kind="train", step=30, loss=2.0, straggler_flagged=None)
    log.write(kind="train", step=40, loss=1.9, straggler_ratio=1.52, straggler_flagged=flag)
    log.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    texts = [
        (e.step, e.tensor_proto.string_val[0].decode())
        for e in acc.Tensors("train/straggler_flagged/text_summary")
    ]
    assert texts == [(40, "STRAGGLER flagged: rank 1 on nid005012 (GPU 3), data x1.52 for 3 intervals")]
