"""Hangs and stragglers on a real CUDA GPU (issue 25, docs/hangs.md): a rank whose GPU stops making
progress is declared hung with its GPU, its line and the NCCL collective it has queued (read from NCCL's
own flight recorder); backward's tail wait (`exatrain.backward`) is timed with CUDA events, without a host
sync, and tells a wait for the gradient reduction apart from compute.

What one GPU cannot show: NCCL refuses two ranks on one GPU, so every NCCL group here has one rank. A hang
where other ranks wait in a collective that one rank never joins is tested with gloo (tests/distributed/
test_hangs.py); here a kernel that spins for two minutes stands in for a stuck GPU, and a side-stream
kernel before the all-reduce stands in for the time a rank waits for slower peers.
"""

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import exatrain
from exatrain.env.affinity import physical_gpu
from exatrain.errors import EXIT_HANG
from exatrain.observe import backward_wait

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).with_name("gpu_hang_loop.py")
TIMEOUT_S = 10


def _line_of(marker: str) -> int:
    return next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1) if marker in line)


def _spin_s(cycles: int) -> float:
    """GPU seconds of a `torch.cuda._sleep(cycles)` kernel, timed with CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0


def _cycles_per_s() -> float:
    _spin_s(10**6)  # warm-up
    return 10**8 / _spin_s(10**8)


def test_a_rank_whose_gpu_stops_is_declared_hung_with_its_gpu_line_and_queued_collective(
    exatrain_cli, tmp_path
):
    run = tmp_path / "run"
    args = [f"--hang-timeout={TIMEOUT_S}", f"--run-dir={run}", str(SCRIPT), f"{_cycles_per_s():.0f}", "20"]
    r = exatrain_cli("run", "--nproc=1", *args, timeout=150)
    assert r.returncode == EXIT_HANG, r.stdout[-2000:] + r.stderr[-4000:]
    assert "is deprecated" not in r.stderr  # the recorder's buffer set under the name this torch reads
    diagnosis = (run / "hang" / "diagnosis.txt").read_text().strip()
    assert diagnosis in r.stderr
    attempt = run / "hang" / "attempt-0"
    report = json.loads((attempt / "report-rank-0.json").read_text())
    assert diagnosis.startswith(
        f"exatrain: HANG (no progress for over {TIMEOUT_S} s): rank 0 ({report['host']}, "
        f"GPU {physical_gpu(0)}, pid {report['pid']}) has made no progress for "
    ), diagnosis
    assert f"gpu_hang_loop.py:{_line_of('# STALL-LINE')} " in diagnosis, diagnosis
    collective = report["collective"]
    assert collective["op"] == "nccl:all_reduce", report
    assert collective["enqueued"] == collective["completed"] + 1, report
    assert f", with its nccl:all_reduce #{collective['enqueued']} queued and not completed." in diagnosis
    assert report["step"] == 5 and TIMEOUT_S <= report["stalled_s"] < TIMEOUT_S + 30, report
    # NCCL's own recorder, written in full: the queued all_reduce is there
    dump = json.loads((attempt / "fr-rank-0.json").read_text())
    names = [e["profiling_name"] for e in dump["entries"] if e["collective_seq_id"] == collective["enqueued"]]
    assert names == ["nccl:all_reduce"], dump["entries"][-3:]
    stacks = (attempt / "stacks-rank-0.txt").read_text()
    assert f'gpu_hang_loop.py", line {_line_of("# STALL-LINE")} in main' in stacks, stacks


def _late_spin(cycles: int):
    """A gradient hook that queues, for the end of backward, a kernel of `cycles` on the current stream:
    queued after exatrain's end-of-compute callback, as DDP's finalize_backward is, so it is tail wait."""

    def hook(grad):
        torch.autograd.Variable._execution_engine.queue_callback(lambda: torch.cuda._sleep(cycles))
        return grad

    return hook


def _timed_backward(model, x, strict: bool = True) -> tuple[float, int]:
    """The tail wait `exatrain.backward` measured for one backward; `strict`: with no host sync inside
    (sync debug mode raises on one)."""
    backward_wait.take()
    loss = model(x).square().mean()
    torch.cuda.set_sync_debug_mode("error" if strict else 0)
    try:
        exatrain.backward(loss)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return backward_wait.take()


def test_backward_tail_wait_on_the_gpu_counts_work_after_the_last_gradient_not_compute():
    cycles = int(0.2 * _cycles_per_s())
    spin = _spin_s(cycles)
    x = torch.randn(64, 256, device="cuda")
    tail = torch.nn.Linear(256, 256).cuda()
    tail.weight.register_hook(_late_spin(cycles))
    waited, count = _timed_backward(tail, x)
    assert count == 1 and 0.5 * spin <= waited <= 2 * spin, (waited, spin)

    compute = torch.nn.Linear(256, 256).cuda()  # the same kernel inside the forward: compute, not waiting
    compute.register_forward_pre_hook(lambda *_: torch.cuda._sleep(cycles))
    waited, count = _timed_backward(compute, x)
    assert count == 1 and waited < 0.1 * spin, (waited, spin)


def test_ddp_backward_tail_wait_is_the_wait_for_its_nccl_all_reduce(nccl_group_of_one):
    """DDP on a real NCCL group: a comm hook makes the bucket's all_reduce wait for a side-stream kernel (a
    stand-in for slower peers), which DDP's finalize_backward then waits for: that is the tail wait."""
    cycles = int(0.2 * _cycles_per_s())
    spin = _spin_s(cycles)
    side = torch.cuda.Stream()

    def slow_all_reduce(state, bucket):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(cycles)
            work = dist.all_reduce(bucket.buffer(), async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    model = DistributedDataParallel(torch.nn.Linear(256, 256).cuda(), device_ids=[0])
    x = torch.randn(64, 256, device="cuda")
    # (not strict: DDP's own first steps may sync; the plain tests above check exatrain's part)
    plain = [_timed_backward(model, x, strict=False)[0] for _ in range(3)][-1]  # buckets built by now
    model.register_comm_hook(None, slow_all_reduce)
    waited, count = [_timed_backward(model, x, strict=False) for _ in range(3)][-1]
    assert count == 1 and 0.5 * spin <= waited - plain <= 2 * spin, (waited, plain, spin)


def test_fsdp_collective_waits_are_timed_with_cuda_events_without_a_host_sync(nccl_group_of_one):
    """exatrain's FSDP2 (apply_fsdp) on a 1-GPU mesh: each parameter group's gather and reduce-scatter
    (distributed/collective_waits.py) is timed by a pair of CUDA events on the current stream, beside
    backward's tail, and a step of forward and `exatrain.backward` makes no host sync. A group of one rank
    has no peer to wait for, so the waits themselves are near zero here; tests/distributed/
    test_stragglers.py shows them naming a slow rank on CPU ranks."""
    from torch.distributed.device_mesh import init_device_mesh

    from exatrain.distributed.parallelize import apply_fsdp
    from exatrain.distributed.state_dict import load_full_state_dict
    from exatrain.models.transformer import build_model

    torch.manual_seed(0)
    reference = build_model("small", 512, 128)
    with torch.device("meta"):
        model = build_model("small", 512, 128)
    mesh = init_device_mesh("cuda", (1,), mesh_dim_names=("dp_shard",))
    apply_fsdp(model, model.layers, mesh, True, None, False)
    load_full_state_dict(model, reference.state_dict(), torch.device("cuda"))
    x = torch.randint(512, (4, 128), device="cuda")
    for _ in range(2):  # FSDP's lazy initialisation happens in the first step
        exatrain.backward(model(x, x.roll(-1, 1)))
    backward_wait.take()
    loss = model(x, x.roll(-1, 1))
    torch.cuda.set_sync_debug_mode("error")
    try:
        exatrain.backward(loss)
        pairs = len(backward_wait._WAITS.pending)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    groups = len(model.layers) + 1  # one fully_shard per block and the root
    assert pairs >= 1 + 2 * groups, pairs  # the tail, and at least each group's gathers in forward/backward
    seconds, count = backward_wait.take()
    assert count == 1 and 0.0 <= seconds < 1.0, seconds


def test_tensor_parallel_waits_are_timed_with_cuda_events_without_a_host_sync(nccl_group_of_one):
    """Tensor parallelism's functional collectives on a real NCCL group: the wait for one (at the first
    use of its result, torch's `wait_tensor`, wrapped by distributed/collective_waits.py) is timed by a pair
    of CUDA events, without a host sync."""
    from torch.distributed import _functional_collectives as funcol

    from exatrain.distributed.collective_waits import time_tp_waits

    assert time_tp_waits()
    x = torch.ones(1024, device="cuda")
    backward_wait.take()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = funcol.all_reduce(x, "sum", dist.group.WORLD) * 2  # the multiplication waits for the result
        pairs = len(backward_wait._WAITS.pending)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert pairs == 1 and torch.equal(y, 2 * x)
    seconds, count = backward_wait.take()
    assert count == 0 and 0.0 <= seconds < 1.0, seconds
