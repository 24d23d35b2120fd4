"""StepMetrics in one process (no process group): the loss mean, phases, MFU and FLOP counting."""

import pytest
import torch

import exatrain
from exatrain.observe.flops import measure_flops_per_token, peak_flops, transformer_flops_per_token
from exatrain.observe.step_metrics import StepMetrics


def test_loss_is_the_mean_over_the_window_and_records_only_on_log_steps():
    m = StepMetrics(log_every=2, flops_per_token=10.0, peak_flops=1e3)
    out = []
    for loss in (1.0, 3.0, 5.0, 9.0):
        m.add_loss(torch.tensor(loss))
        with m.phase("optimizer"):
            pass
        m.add_time("checkpoint", 0.5)
        out.append(m.end_step(tokens=4, samples=1))
    assert out[0] is None and out[2] is None
    assert out[1]["loss"] == 2.0 and out[3]["loss"] == 7.0
    assert out[3]["time_checkpoint_s"] == pytest.approx(0.5)
    assert out[3]["mfu"] == pytest.approx(out[3]["tokens_per_s"] * 10.0 / 1e3)
    assert out[3]["slowest_rank"] == 0 and out[3]["rank_skew_s"] == 0


def test_last_step_is_a_log_step_and_bad_input_is_named():
    m = StepMetrics(log_every=10, last_step=3)
    records = [m.end_step() for _ in range(3)]
    assert records[:2] == [None, None] and records[2]["step"] == 3 and records[2]["loss"] is None
    with pytest.raises(ValueError, match="phase 'fwd'"):
        with m.phase("fwd"):
            pass
    with pytest.raises(ValueError, match="log_every=0"):
        StepMetrics(log_every=0)


def test_peak_table_bydevice_name():
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_flops("AMD Instinct MI250X") == 191.5e12
    assert peak_flops("NVIDIA A100-SXM4-40GB") == 312e12
    assert peak_flops("Some CPU") is None and peak_flops(None) is None


def test_measured_flops_of_a_linear_layer_match_forward_plus_backward():
    """A bias-free Linear(d_in, d_out) on n tokens: forward 2 n d_in d_out, backward twice that."""
    d_in, d_out, n = 16, 32, 8
    layer = torch.nn.Linear(d_in, d_out, bias=False)
    x = torch.randn(n, d_in, requires_grad=True)
    per_token = measure_flops_per_token(lambda: layer(x).sum().backward(), tokens=n)
    assert per_token == 6 * d_in * d_out
    assert transformer_flops_per_token(1000, 2, 8, 4) == 6 * 1000 + 12 * 2 * 8 * 4


def test_step_metrics_is_a_lazy_public_name():
    assert exatrain.StepMetrics is StepMetrics and exatrain.observe.StepMetrics is StepMetrics


def test_progress_line_shows_the_breakdown():
    import io

    from exatrain.observe.progress import ProgressReporter

    out = io.StringIO()
    record = {
        "mfu": 0.412,
        "peak_mem_gib": 31.5,
        "step_s": 0.5,
        "time_data_s": 0.01,
        "time_forward_backward_s": 0.4,
        "time_optimizer_s": 0.05,
        "time_checkpoint_s": 0.0,
        "rank_skew_s": 0.0123,
        "slowest_rank": 7,
    }
    ProgressReporter(10, enabled=True, log_every=10, stream=out).step(10, 2.5, 1e-3, 12345.0, record)
    assert out.getvalue() == (
        "step     10/10 | loss 2.5000 | lr 1.00e-03 | 12,345 tok/s | MFU 41.2% | peak 31.5 GiB"
        " | step 0.50 s = data 0.01 + fwd/bwd 0.40 + opt 0.05 + ckpt 0.00 | skew 0.012 s (rank 7)\n"
    )


def test_one_rank_is_never_a_straggler():
    m = StepMetrics(log_every=1)
    with m.phase("data"):
        pass
    record = m.end_step()
    assert record["straggler_rank"] is None and record["straggler_ratio"] == 1.0


def test_progress_line_names_a_straggler_that_slows_steps_by_1_2_or_more():
    import io

    from exatrain.observe.progress import ProgressReporter

    base = {
        "mfu": None,
        "peak_mem_gib": None,
        "step_s": 0.5,
        "time_data_s": 0.1,
        "time_forward_backward_s": 0.3,
        "time_optimizer_s": 0.05,
        "time_checkpoint_s": 0.0,
        "rank_skew_s": 0.2,
        "slowest_rank": 3,
        "straggler_rank": 3,
        "straggler_phase": "data",
        "straggler_excess_s": 0.1,
    }
    lines = []
    for ratio in (1.25, 1.1):
        out = io.StringIO()
        ProgressReporter(10, enabled=True, log_every=10, stream=out).step(
            10, 2.5, 1e-3, 1.0, {**base, "straggler_ratio": ratio}
        )
        lines.append(out.getvalue())
    assert lines[0].endswith(" | skew 0.200 s (rank 3) | straggler rank 3 (data, x1.25)\n")
    assert lines[1].endswith(" | skew 0.200 s (rank 3)\n")
    out = io.StringIO()  # observe.straggler_ratio = 1.3: the x1.25 straggler is below it
    ProgressReporter(10, enabled=True, log_every=10, stream=out, straggler_ratio=1.3).step(
        10, 2.5, 1e-3, 1.0, {**base, "straggler_ratio": 1.25}
    )
    assert out.getvalue().endswith(" | skew 0.200 s (rank 3)\n")
    out = io.StringIO()  # observe.straggler_ratio = 1.05: a x1.1 straggler is named
    ProgressReporter(10, enabled=True, log_every=10, stream=out, straggler_ratio=1.05).step(
        10, 2.5, 1e-3, 1.0, {**base, "straggler_ratio": 1.1}
    )
    assert out.getvalue().endswith(" | straggler rank 3 (data, x1.10)\n")


@pytest.mark.parametrize(
    "override, key",
    [
        ("--observe.straggler_ratio=1.0", "observe.straggler_ratio"),
        ("--observe.straggler_intervals=0", "observe.straggler_intervals"),
    ],
)
def test_the_trainer_refuses_a_straggler_setting_that_cannot_work(override, key, capsys, tmp_path):
    from exatrain.cli.main import main

    code = main(["train", f"--run.dir={tmp_path}", override])
    err = capsys.readouterr().err
    assert code == 2 and key in err and "HINT:" in err, err


@pytest.mark.parametrize(
    "environ, index, expected",
    [
        ({}, 1, "GPU 1"),
        ({"CUDA_VISIBLE_DEVICES": "4,5"}, 1, "GPU 5"),  # SLURM's gres binding of a task to GPUs 4 and 5
        ({"ROCR_VISIBLE_DEVICES": "6"}, 0, "GPU 6"),  # LUMI-G: one GCD per task, seen as device 0
    ],
)
def test_a_flagged_straggler_is_named_by_the_nodes_gpu_number(monkeypatch, environ, index, expected):
    from exatrain.observe.step_metrics import device_name

    for name in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert device_name(torch.device("cuda", index)) == expected
    assert device_name(torch.device("cpu")) == "CPU"
