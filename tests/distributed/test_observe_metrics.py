"""exatrain.StepMetrics on real gloo ranks: no collective and no host read of a tensor except on log
steps, global throughput summed over ranks, and the slowest rank named."""

import json
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist

from exatrain.observe.gpu_monitor import read_samples
from tests.distributed.helpers import spawn
from tests.unit.test_observe_gpu_monitor import STAND_IN

pytestmark = pytest.mark.dist

# what a host-device sync or a cross-rank exchange goes through: counted per step while the loop runs
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "broadcast",
    "reduce",
    "barrier",
    "gather",
    "reduce_scatter",
)
TENSOR_READS = ("item", "tolist", "__float__", "__int__", "__bool__", "cpu", "numpy")


class Counter:
    """Patches torch.distributed's collectives and Tensor's host reads with counting wrappers."""

    def __init__(self):
        self.calls: list[str] = []
        self._saved = []

    def __enter__(self):
        for owner, names in ((dist, COLLECTIVES), (torch.Tensor, TENSOR_READS)):
            for name in names:
                original = getattr(owner, name)
                self._saved.append((owner, name, original))
                setattr(owner, name, self._wrap(name, original))
        return self

    def _wrap(self, name, original):
        def counted(*args, **kwargs):
            self.calls.append(name)
            return original(*args, **kwargs)

        return counted

    def __exit__(self, *exc):
        for owner, name, original in self._saved:
            setattr(owner, name, original)

    def take(self) -> list[str]:
        calls, self.calls = self.calls, []
        return calls


def _counting_loop(rank, world, env, out):
    from exatrain.distributed import init_distributed, teardown
    from exatrain.observe import StepMetrics

    init_distributed(env, "cpu", timeout_s=120)
    torch.manual_seed(rank)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    metrics = StepMetrics(log_every=3, last_step=7, flops_per_token=100.0)
    per_step, records = [], {}
    with Counter() as counter:
        for step in range(1, 8):
            counter.take()
            with metrics.phase("data"):
                x = torch.randn(5, 8)
                if rank == 1:
                    time.sleep(0.2)  # rank 1 is the straggler: its data wait is longer on every step
            with metrics.phase("forward_backward"):
                loss = model(x).pow(2).mean()
                loss.backward()
            with metrics.phase("optimizer"):
                opt.step()
                opt.zero_grad()
            metrics.add_loss(loss)
            record = metrics.end_step(tokens=x.shape[0] * 8, samples=x.shape[0])
            per_step.append(counter.take())
            if record is not None:
                records[step] = record
    teardown()
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"calls": per_step, "records": records}, f)


def test_no_sync_between_log_steps_and_global_rates(tmp_path):
    """Steps 1,2,4,5 make no collective and read no tensor on the host; log steps 3,6 and the last (7)
    make exactly one all_gather; both ranks get the same record, tokens summed over the 2 ranks."""
    spawn(_counting_loop, 2, str(tmp_path))
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in results:
        for step, calls in enumerate(r["calls"], start=1):
            if step in (3, 6, 7):
                assert calls.count("all_gather") == 1, (step, calls)
                # step 7 flags the straggler (3rd interval in a row): one all_gather_object of host names
                extra = {"all_gather_object"} if step == 7 else set()
                assert not {c for c in calls if c in COLLECTIVES} - {"all_gather"} - extra, (step, calls)
            else:
                assert calls == [], f"step {step} synchronised: {calls}"
        assert sorted(r["records"], key=int) == ["3", "6", "7"]
    assert results[0]["records"] == results[1]["records"]
    rec = results[0]["records"]["6"]
    # 2 ranks x 5 samples x 8 tokens per step, over the window's wall time (3 steps)
    assert rec["samples_per_s"] * rec["step_s"] * 3 == pytest.approx(2 * 5 * 3)
    assert rec["tokens_per_s"] == pytest.approx(rec["samples_per_s"] * 8)
    assert rec["slowest_rank"] == 1 and rec["rank_skew_s"] > 0
    # the straggler by its data phase: >= 0.2 s more per step than the median rank (the lower one of 2)
    assert (
        rec["straggler_rank"] == 1 and rec["straggler_phase"] == "data" and rec["straggler_excess_s"] >= 0.2
    )
    assert rec["straggler_ratio"] == pytest.approx(
        rec["step_s"] / (rec["step_s"] - rec["straggler_excess_s"])
    )
    # rank 1, slow in every interval, is flagged once, on the 3rd (straggler_intervals), with its host
    flags = {s: r["straggler_flagged"] for s, r in results[0]["records"].items()}
    assert flags["3"] is None and flags["6"] is None, flags
    assert flags["7"] == {
        "rank": 1,
        "host": socket.gethostname(),
        "device": "CPU",
        "phase": "data",
        "ratio": results[0]["records"]["7"]["straggler_ratio"],
        "intervals": 3,
    }
    # the breakdown is the mean over ranks: rank 1 waits >= 0.2 s per step for data, rank 0 barely
    assert rec["time_data_s"] >= 0.1
    assert rec["mfu"] is None and rec["peak_mem_gib"] is None  # CPU: no peak FLOP/s, no device memory


TRAIN = [
    "--train.steps=5",
    "--train.eval_every=0",
    "--train.eval_at_start=false",
    "--train.eval_batches=2",
    "--train.global_batch_size=8",
    "--train.micro_batch_size=4",
    "--train.warmup_steps=2",
    "--data.seq_len=16",
]


def test_trainer_logs_window_means_and_the_breakdown(exatrain_cli, tmp_path):
    """The reference trainer on 2 ranks logging every 2nd step (profiling rank 1, sampling "GPUs"): the loss
    of step 2 is the mean of steps 1 and 2 of a run logging every step (1 process: the same losses within
    1e-5), each record carries the global throughput (tokens per step = 8 samples x 16) and the breakdown."""
    from exatrain.observe import read_metrics

    every = tmp_path / "every"
    r = exatrain_cli("train", "--nproc=1", f"--run.dir={every}", "--train.log_every=1", *TRAIN)
    assert r.returncode == 0, r.stdout + r.stderr
    sparse = tmp_path / "sparse"
    bin_dir = tmp_path / "bin"  # a stand-in nvidia-smi for the GPU sampler: no GPU here
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(STAND_IN)
    (bin_dir / "nvidia-smi").chmod(0o755)
    r = exatrain_cli(
        "train",
        "--nproc=2",
        f"--run.dir={sparse}",
        "--train.log_every=2",
        "--profiler.ranks=last",
        "--profiler.steps=2-3",
        "--observe.monitor_interval_s=0.1",
        "--run.hang_timeout_s=120",
        *TRAIN,
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}"},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    losses = {m["step"]: m["loss"] for m in read_metrics(every / "metrics.jsonl") if m["kind"] == "train"}
    records = {m["step"]: m for m in read_metrics(sparse / "metrics.jsonl") if m["kind"] == "train"}
    assert sorted(records) == [2, 4, 5]
    # the hang watcher (run.hang_timeout_s) watched both ranks to the end without declaring a hang
    for rank in (0, 1):
        beat = json.loads((sparse / "hang" / "attempt-0" / f"beat-rank-{rank}.json").read_text())
        assert beat["step"] == 5 and beat["rank"] == rank, beat
    assert not (sparse / "hang" / "diagnosis.txt").exists()
    assert records[2]["loss"] == pytest.approx((losses[1] + losses[2]) / 2, abs=1e-5)
    assert records[4]["loss"] == pytest.approx((losses[3] + losses[4]) / 2, abs=1e-5)
    assert records[5]["loss"] == pytest.approx(losses[5], abs=1e-5)
    for rec in records.values():
        assert rec["tokens_per_s"] * rec["step_s"] == pytest.approx(8 * 16)
        assert rec["samples_per_s"] * rec["step_s"] == pytest.approx(8)
        assert rec["slowest_rank"] in (0, 1) and rec["rank_skew_s"] >= 0
        assert rec["time_forward_backward_s"] > 0 and rec["time_data_s"] >= 0 and rec["time_optimizer_s"] > 0
        assert rec["mfu"] is None and rec["peak_mem_gib"] is None  # CPU
    # the same records as TensorBoard scalars (observe.tensorboard = auto: the package is installed)
    from tests.unit.test_observe_tensorboard import read_scalars

    scalars = read_scalars(sparse / "tensorboard")
    assert [s for s, _ in scalars["train/loss"]] == [2, 4, 5]
    assert [v for _, v in scalars["train/loss"]] == pytest.approx([records[s]["loss"] for s in (2, 4, 5)])
    assert [s for s, _ in scalars["eval/loss"]] == [5]
    # --profiler.ranks=last: one trace, of rank 1, a Chrome trace JSON with the optimizer's events
    traces = list((sparse / "profile").iterdir())
    assert [t.name.split("-")[1] for t in traces] == ["rank00001"]
    assert json.loads(traces[0].read_text())["traceEvents"]
    # one GPU sampler on the node (local rank 0): its file, and its summary printed once per GPU
    host = socket.gethostname()
    assert read_samples(sparse / "monitor" / f"{host}.jsonl")
    assert r.stdout.count(f"GPU 0 on {host}: ") == 1 and r.stdout.count(f"GPU 1 on {host}: ") == 1


def _profiled_loop(rank, world, env, run_dir):
    from exatrain.distributed import init_distributed, teardown
    from exatrain.observe.profiler import StepProfiler

    init_distributed(env, "cpu", timeout_s=120)
    model = torch.nn.Linear(8, 4)
    profiler = StepProfiler("0,last", "2-3", rank, world, run_dir)
    for step in range(1, 5):
        profiler.begin(step)
        with torch.profiler.record_function(f"my_step_{step}"):
            model(torch.randn(2, 8)).sum().backward()
        dist.barrier()
        profiler.end(step)
    profiler.close()
    teardown()


def test_traces_of_exactly_the_chosen_ranks(tmp_path):
    """profile.ranks = 0,last on 3 ranks: traces of ranks 0 and 2 only, valid Chrome trace JSON holding
    steps 2 and 3 (and not 1 or 4)."""
    spawn(_profiled_loop, 3, str(tmp_path))
    traces = sorted((tmp_path / "profile").iterdir())
    assert [t.name.split("-")[1] for t in traces] == ["rank00000", "rank00002"]
    for t in traces:
        names = {e.get("name") for e in json.loads(t.read_text())["traceEvents"]}
        assert {"my_step_2", "my_step_3"} <= names and not {"my_step_1", "my_step_4"} & names
