"""exatrain.StepMetrics on real gloo ranks: no collective and no host read of a tensor except on log
steps, global throughput summed over ranks, and the slowest rank named."""

import json
import time

import pytest
import torch
import torch.distributed as dist

from tests.distributed.helpers import spawn

pytestmark = pytest.mark.dist

# what a host-device sync or a cross-rank exchange goes through: counted per step while the loop runs
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
               "reduce", "barrier", "gather", "reduce_scatter")
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
                assert not {c for c in calls if c in COLLECTIVES} - {"all_gather"}, (step, calls)
            else:
                assert calls == [], f"step {step} synchronised: {calls}"
        assert sorted(r["records"], key=int) == ["3", "6", "7"]
    assert results[0]["records"] == results[1]["records"]
    rec = results[0]["records"]["6"]
    # 2 ranks x 5 samples x 8 tokens per step, over the window's wall time (3 steps)
    assert rec["samples_per_s"] * rec["step_s"] * 3 == pytest.approx(2 * 5 * 3)
    assert rec["tokens_per_s"] == pytest.approx(rec["samples_per_s"] * 8)
    assert rec["slowest_rank"] == 1 and rec["rank_skew_s"] > 0
    # the breakdown is the mean over ranks: rank 1 waits >= 0.2 s per step for data, rank 0 barely
    assert rec["time_data_s"] >= 0.1
    assert rec["mfu"] is None and rec["peak_mem_gib"] is None  # CPU: no peak FLOP/s, no device memory
