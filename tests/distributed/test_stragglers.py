"""Straggler flagging with real processes (docs/hangs.md, issue 25): the reference trainer on 2 gloo ranks
under `exatrain run --nproc 2`, rank 1 sleeping 0.3 s in every step (straggler_train.py), logging every 2nd
step for 6 steps: rank 1 is flagged once, on the 3rd log interval, with its host, device and phase, in the
progress line, metrics.jsonl and the HTML report of `exatrain report`. Once in its data phase, once in its
forward (a compute-side straggler: rank 0 waits for it inside DDP's all-reduce, or under FSDP at its
parameter gathers, so both ranks' raw forward_backward times are alike and only rank 1's own time, less
those waits, names it)."""

import socket
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

SCRIPT = Path(__file__).with_name("straggler_train.py")
TRAIN = [
    "--train.steps=6",
    "--train.log_every=2",
    "--train.eval_every=0",
    "--train.eval_at_start=false",
    "--train.eval_batches=1",
    "--train.global_batch_size=4",
    "--train.micro_batch_size=2",
    "--train.warmup_steps=1",
    "--data.seq_len=16",
    "--observe.tensorboard=off",
]


def _train(exatrain_cli, run: Path, where: str, layout: list[str] = ()) -> tuple[str, list[dict]]:
    """Output and train records of the 2-rank run with rank 1 slow in `where` (`layout`: more trainer
    options, e.g. FSDP)."""
    from exatrain.observe import read_metrics

    r = exatrain_cli("run", "--nproc=2", str(SCRIPT), where, f"--run.dir={run}", *TRAIN, *layout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    records = [m for m in read_metrics(run / "metrics.jsonl") if m["kind"] == "train"]
    assert [m["step"] for m in records] == [2, 4, 6]
    return r.stdout + r.stderr, records


def test_a_rank_slow_in_every_step_is_flagged_once_in_metrics_progress_and_report(exatrain_cli, tmp_path):
    run = tmp_path / "run"
    out, records = _train(exatrain_cli, run, "data")
    for m in records:  # named as the straggler, with its phase, in every interval
        assert m["straggler_rank"] == 1 and m["straggler_phase"] == "data" and m["straggler_ratio"] >= 1.2, m
    flags = [m["straggler_flagged"] for m in records]
    assert flags[:2] == [None, None]
    host = socket.gethostname()
    assert flags[2] == {
        "rank": 1,
        "host": host,
        "device": "CPU",
        "phase": "data",
        "ratio": records[2]["straggler_ratio"],
        "intervals": 3,
    }
    line = (
        f"STRAGGLER flagged: rank 1 on {host} (CPU), data x{records[2]['straggler_ratio']:.2f} for 3 "
        "intervals"
    )
    assert out.count(line) == 1, out[-3000:]
    html = tmp_path / "report.html"
    r = exatrain_cli("report", str(run), f"--out={html}")
    assert r.returncode == 0, r.stdout + r.stderr
    page = html.read_text()
    row = f"<tr><td>run</td><td>6</td><td>1</td><td>{host}</td><td>CPU</td><td>data</td>"
    assert "<h2>Stragglers flagged</h2>" in page and row in page, page[-2000:]
    assert f"| run | 6 | 1 | {host} | CPU | data |" in html.with_suffix(".md").read_text()


ENGINES = {
    "ddp": [],
    "fsdp": ["--parallel.dp_shard=2"],
    "tp": ["--parallel.tp=2"],
    "deepspeed_zero2": ["--engine.name=deepspeed", "--engine.zero_stage=2"],
    "horovod": ["--engine.name=horovod"],
}


@pytest.mark.parametrize("layout", ENGINES.values(), ids=ENGINES.keys())
def test_a_rank_slow_in_its_forward_is_named_by_its_own_forward_backward_time(exatrain_cli, tmp_path, layout):
    """DDP: rank 0 waits for rank 1 in backward's gradient all-reduce (its tail). FSDP: rank 0 waits at
    the next parameter gather in the forward and the backward; TP: at the next all-reduce of activations;
    both timed by distributed/collective_waits.py (without it rank 1 is not named: seen by hand, the
    checkpoint phase (FSDP) or no rank (TP) was). DeepSpeed ZeRO-2: inside its `backward(loss)`; Horovod:
    in `optimizer.synchronize()` (engines/horovod), timed by `waiting()`."""
    out, records = _train(exatrain_cli, tmp_path / "run", "compute", layout)
    for m in records:
        assert m["straggler_rank"] == 1 and m["straggler_phase"] == "forward_backward", m
        assert m["straggler_excess_s"] >= 0.25 and m["straggler_ratio"] >= 1.2, m  # most of the 0.3 s
    assert records[2]["straggler_flagged"]["rank"] == 1, records[2]
    assert out.count("STRAGGLER flagged: rank 1 on") == 1, out[-3000:]
