"""A hand-written loop on exatrain's public API (tests/distributed/api_loop.py) on real gloo ranks started
the way mpirun starts them: 2 ranks against 1 process, kill -9 and resume, FSDP resharded from 2 ranks to 1.

Tolerances (fp32): 2 ranks and 1 process see the same global batch of 32 per step; only the summation order
differs (each rank's mean over 16 samples, then the gradient all-reduce / reduce-scatter), so every step's
loss agrees within 1e-5 relative. A run killed with kill -9 and resumed in the same layout repeats the
uninterrupted run exactly (same data, same sums, optimizer, schedule and loader position restored).
"""

import shutil
import signal
import time
from pathlib import Path

import pytest

from exatrain.observe import read_metrics
from tests.distributed.api_runs import losses, run_ranks, start_ranks

pytestmark = pytest.mark.dist

LOOP = Path(__file__).with_name("api_loop.py")
STEPS = ["--steps", "12", "--interval", "3"]
RTOL = 1e-5


def _close(a: dict, b: dict, steps) -> bool:
    return all(abs(a[s] - b[s]) <= RTOL * max(abs(a[s]), 1e-3) for s in steps)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same 12 steps as 1 process, as 2 DDP ranks and as 2 FSDP ranks (checkpoints every 3 steps)."""
    tmp = tmp_path_factory.mktemp("api")
    out = {}
    for name, world, extra in (
        ("single", 1, []),
        ("ddp", 2, ["--layout", "ddp"]),
        ("fsdp", 2, ["--layout", "fsdp", "--dp-shard", "2"]),
    ):
        run_ranks(LOOP, [str(tmp / name), *STEPS, *extra], world, tmp / f"{name}-logs")
        out[name] = tmp / name
    return out


@pytest.mark.parametrize("layout", ["ddp", "fsdp"])
def test_two_ranks_match_one_process(runs, layout):
    single, multi = losses(runs["single"]), losses(runs[layout])
    assert sorted(multi) == list(range(1, 13)) == sorted(single)
    assert _close(single, multi, range(1, 13)), (single, multi)
    assert single[12] < 0.5 * single[1], "the loop trains (the loss falls)"
    # 200 samples, 32 per step: 6 steps per epoch, so steps 7-12 are the second (reshuffled) epoch
    assert [m["epoch"] for m in read_metrics(runs[layout] / "metrics.jsonl")][5:7] == [1, 1]


def test_kill_9_mid_run_then_resume_equals_uninterrupted(runs, tmp_path):
    run = tmp_path / "killed"
    procs = start_ranks(LOOP, [str(run), *STEPS, "--layout", "ddp", "--sleep", "0.3"], 2, tmp_path / "logs")
    deadline = time.monotonic() + 480
    while not (run / "checkpoints" / "step-6").is_dir() or len(losses(run)) < 7:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), (
            "the run did not get to step 7"
        )
        time.sleep(0.2)
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()
    killed_at = max(losses(run))
    assert killed_at < 12
    run_ranks(LOOP, [str(run), *STEPS, "--layout", "ddp"], 2, tmp_path / "logs-resumed")
    full, resumed = losses(runs["ddp"]), losses(run)
    assert sorted(resumed) == list(range(1, 13))
    assert resumed == full, "resumed in the same layout, every loss repeats the uninterrupted run exactly"
    last = read_metrics(run / "metrics.jsonl")[-1]
    assert last["seen"] == 12 * 32, "the extra dict came back from the checkpoint"


def test_fsdp_two_ranks_resumed_on_one(runs, tmp_path):
    run = tmp_path / "fsdp-to-1"
    shutil.copytree(runs["fsdp"] / "checkpoints" / "step-6", run / "checkpoints" / "step-6")
    shutil.copy(runs["fsdp"] / "metrics.jsonl", run / "metrics.jsonl")
    run_ranks(LOOP, [str(run), *STEPS], 1, tmp_path / "logs")
    single, resumed = losses(runs["single"]), losses(run)
    assert sorted(resumed) == list(range(1, 13))
    assert _close(single, resumed, range(7, 13)), (single, resumed)
    assert "resumed from" in (tmp_path / "logs" / "rank-0.log").read_text()
