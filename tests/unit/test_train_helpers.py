"""Trainer helpers: LR schedule, progress output (terminal vs log, rank 0 only), preflight checks."""

import io
import math

import pytest

from exatrain.config import load_config
from exatrain.engines.optim import lr_factor
from exatrain.errors import ConfigError
from exatrain.observe import ProgressReporter
from exatrain.train.preflight import preflight


def test_warmup_then_cosine_to_floor():
    t = load_config(None, ["--train.steps=110", "--train.warmup_steps=10", "--train.min_lr_ratio=0.1"]).train
    assert lr_factor(0, t) == pytest.approx(0.1) and lr_factor(9, t) == pytest.approx(1.0)
    assert lr_factor(10, t) == pytest.approx(1.0)
    assert lr_factor(60, t) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_factor(110, t) == pytest.approx(0.1) and lr_factor(500, t) == pytest.approx(0.1)
    factors = [lr_factor(s, t) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(factors, factors[1:]))


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_plain_lines_in_logs_every_n_steps():
    out = io.StringIO()
    p = ProgressReporter(total_steps=25, enabled=True, log_every=10, stream=out)
    for step in range(1, 26):
        p.step(step, loss=1.0, lr=1e-3, tokens_per_s=1234.0)
    p.close()
    lines = out.getvalue().splitlines()
    assert [line.split("|")[0].split()[1] for line in lines] == ["10/25", "20/25", "25/25"]
    assert "1,234 tok/s" in lines[0]


def test_rich_bar_in_a_terminal_and_silence_off_rank_zero():
    tty = _Tty()
    p = ProgressReporter(total_steps=5, enabled=True, log_every=1, stream=tty)
    assert p.bar is not None
    p.step(3, 2.0, 1e-3, 10.0)
    p.line("evaluation done")
    p.close()
    assert p.bar is None
    shown = tty.getvalue()
    assert "3/5" in shown and "loss 2.0000" in shown and "evaluation done" in shown
    assert "step      3/5" not in shown, "a terminal gets the bar, not the log lines"
    silent = io.StringIO()
    q = ProgressReporter(total_steps=5, enabled=False, log_every=1, stream=silent)
    assert q.bar is None
    q.step(5, 2.0, 1e-3, 10.0)
    q.line("hello")
    q.close()
    assert silent.getvalue() == ""


@pytest.mark.parametrize(
    "overrides, world, needle",
    [
        (["--train.global_batch_size=12", "--train.micro_batch_size=4"], 2, "not divisible"),
        (["--model.size=giant"], 1, "giant"),
        (["--train.steps=0"], 1, "train.steps"),
        (["--train.precision=fp8"], 1, "train.precision"),
        (["--data.eval_split=dev"], 1, "data.eval_split"),
        (["--model.dropout=1.5"], 1, "model.dropout"),
    ],
)
def test_preflight_rejects_with_hint(overrides, world, needle):
    with pytest.raises(ConfigError) as e:
        preflight(load_config(None, overrides), world)
    assert needle in str(e.value) and "HINT:" in str(e.value)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_preflight_accepts_defaults_and_returns_the_layout(world):
    """The default layout is DDP over every rank: dp_replicate inferred as the world size."""
    dims = preflight(load_config(None, ["--train.global_batch_size=32", "--train.micro_batch_size=8"]), world)
    assert (dims.dp_replicate, dims.dp_shard, dims.tp, dims.pp) == (world, 1, 1, 1)
    assert dims.dp == world


def test_weights_in_sync_compares_only_ranks_at_the_same_place():
    from exatrain.train.trainer import replicas_agree

    # (pp, dp_shard, tp, digest): shards at different places may differ, replicas of one place may not
    assert replicas_agree([(0, 0, 0, "a"), (0, 1, 0, "b"), (0, 0, 0, "a"), (0, 1, 0, "b")])
    assert not replicas_agree([(0, 0, 0, "a"), (0, 1, 0, "b"), (0, 0, 0, "a"), (0, 1, 0, "c")])


def test_metrics_log_resumed_keeps_only_the_records_up_to_the_checkpoint(tmp_path):
    """A resumed run recomputes the steps after its checkpoint: their old records go, earlier ones stay in
    order; a fresh run starts an empty file."""
    from exatrain.observe import MetricsLog, read_metrics

    path = tmp_path / "metrics.jsonl"
    first = MetricsLog(path, enabled=True)
    for step in range(1, 11):
        first.write(kind="train", step=step, loss=float(step))
        if step % 5 == 0:
            first.write(kind="eval", step=step, loss=0.5)
    MetricsLog(path, enabled=True, resume_step=6)
    assert [(m["kind"], m["step"]) for m in read_metrics(path)] == [
        ("train", 1),
        ("train", 2),
        ("train", 3),
        ("train", 4),
        ("train", 5),
        ("eval", 5),
        ("train", 6),
    ]
    MetricsLog(path, enabled=False, resume_step=2)  # not rank 0: leaves the file alone
    assert len(read_metrics(path)) == 7
    MetricsLog(path, enabled=True)
    assert read_metrics(path) == []


def test_samples_digest_names_a_global_batch_however_it_is_split():
    """Summed over ranks (modulo 2**32) it is the same for any split of the rows into ranks and micro-batches;
    a batch with one sample repeated in place of another has another digest."""
    import torch

    from exatrain.observe.digest import DIGEST_MOD, samples_digest

    x = torch.arange(8 * 5).reshape(8, 5)
    whole = samples_digest([x])
    assert (samples_digest([x[:3], x[3:4]]) + samples_digest([x[4:]])) % DIGEST_MOD == whole
    assert samples_digest([x[4:], x[:4]]) == whole
    repeated = x.clone()
    repeated[7] = x[6]
    assert samples_digest([repeated]) != whole
