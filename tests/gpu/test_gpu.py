"""The GPU path on a real CUDA device: NCCL, device selection, bf16 autocast, FSDP2 mixed precision, per-block
torch.compile, fused AdamW, host-device syncs of the steady-state step, peak memory against `exatrain plan`.

Every test here needs a CUDA GPU; where torch sees none they are skipped with that reason (tests/conftest.py),
so CPU CI reports them as not run. Cheap by design: tiny to medium models, a few steps each. Nothing is faked:
a process group of one rank is a real NCCL group (one GPU cannot host two NCCL ranks).
"""

import gc
import json
import os
import re
import signal
import traceback
import warnings

import pytest
import torch
import torch.distributed as dist

from exatrain.config import load_config
from exatrain.distributed import init_distributed
from exatrain.env import detect_environment
from exatrain.tools.plan import make_plan
from exatrain.train.entry import prepare_data
from exatrain.train.trainer import Trainer

pytestmark = pytest.mark.gpu


def _config(tmp_path, *overrides):
    base = [
        "--model.size=small",
        "--data.seq_len=128",
        "--train.micro_batch_size=8",
        "--train.global_batch_size=8",
        "--train.steps=100",
        "--train.eval_every=0",
        f"--run.dir={tmp_path / 'run'}",
    ]
    return load_config(None, base + list(overrides))


def _trainer(cfg) -> Trainer:
    """The trainer of a single-process run on this machine's GPU (what `exatrain train --nproc=1` builds)."""
    ctx = init_distributed(detect_environment({}), cfg.train.device)
    return Trainer(cfg, ctx, prepare_data(cfg))


def host_syncs(fn) -> list[str]:
    """Run `fn()` with CUDA's sync debug mode on; the message and Python stack of each call that made the host
    wait for the GPU (`.item()`, a blocking copy to the CPU, a data-dependent shape, ...)."""
    found = []

    def record(message, category, filename, lineno, file=None, line=None):
        found.append(f"{message}\n" + "".join(traceback.format_stack(limit=14)[:-1]))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    return found


def test_nccl_group_of_one_all_reduce(nccl_group_of_one):
    from exatrain.distributed.collectives import any_rank, sum_across_ranks

    assert dist.get_backend() == "nccl"
    t = torch.tensor([1.5, -2.0, 3.25], device="cuda", dtype=torch.bfloat16)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    assert t.tolist() == [1.5, -2.0, 3.25]
    assert sum_across_ranks([1.5, 2.0], torch.device("cuda")) == [1.5, 2.0]
    assert any_rank(True, torch.device("cuda")) and not any_rank(False, torch.device("cuda"))


def test_device_selection_picks_the_gpu():
    ctx = init_distributed(detect_environment({}), "auto")
    assert ctx.device == torch.device("cuda", 0) and torch.cuda.current_device() == 0
    assert ctx.backend is None  # one process: no group
    assert init_distributed(detect_environment({}), "cpu").device == torch.device("cpu")


def test_train_cli_runs_on_the_gpu(exatrain_cli, tmp_path):
    r = exatrain_cli(
        "train",
        "--nproc=1",
        "--model.size=tiny",
        "--data.seq_len=64",
        "--train.steps=6",
        "--train.log_every=2",
        "--train.eval_batches=2",
        f"--run.dir={tmp_path / 'run'}",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rank = json.loads((tmp_path / "run" / "ranks" / "rank-0.json").read_text())
    assert rank["device"] == "cuda:0", rank
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["final_eval"]["loss"] < summary["initial_eval"]["loss"]


def test_bf16_autocast_step_and_fused_adamw(tmp_path):
    """precision=auto on a GPU: bf16 matmuls under autocast, fp32 parameters, gradients and loss; fused
    AdamW."""
    trainer = _trainer(_config(tmp_path))
    seen = {}
    trainer.model.layers["0"].attention.wq.register_forward_hook(
        lambda m, args, out: seen.update(out=out.dtype, weight=m.weight.dtype)
    )
    first = trainer.engine.train_step(trainer._micro_batches())
    assert seen == {"out": torch.bfloat16, "weight": torch.float32}
    assert first.dtype == torch.float32 and torch.isfinite(first)
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in trainer.model.parameters())
    trainer.optimizer.zero_grad(set_to_none=True)
    assert trainer.optimizer.defaults["fused"] is True
    losses = [trainer.train_step(trainer._micro_batches()).item() for _ in range(30)]
    state = next(iter(trainer.optimizer.state.values()))
    assert state["step"].device.type == "cuda"  # fused AdamW keeps its step counters on the GPU
    assert sum(losses[-5:]) / 5 < first.item() - 0.5, losses


def test_fsdp2_bf16_params_fp32_reduce(nccl_group_of_one):
    """FSDP2 with param_dtype=bf16 on a 1-GPU mesh: blocks compute with bf16 weights, the sharded parameters
    and their gradients stay fp32 (reduced in fp32), and the loss matches the fp32 model's within bf16
    error."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from exatrain.distributed.parallelize import apply_fsdp
    from exatrain.distributed.state_dict import load_full_state_dict
    from exatrain.engines.optim import build_optimizer
    from exatrain.models.transformer import build_model

    torch.manual_seed(0)
    reference = build_model("small", 512, 128).cuda()
    with torch.device("meta"):
        model = build_model("small", 512, 128)
    apply_fsdp(
        model,
        model.layers,
        init_device_mesh("cuda", (1,), mesh_dim_names=("dp_shard",)),
        True,
        torch.bfloat16,
        False,
    )
    load_full_state_dict(model, reference.state_dict(), torch.device("cuda"))
    seen = {}
    model.layers["1"].ffn.w1.register_forward_hook(
        lambda m, args, out: seen.update(weight=m.weight.dtype, out=out.dtype)
    )
    x = torch.randint(512, (4, 128), device="cuda")
    loss = model(x, x.roll(-1, 1))
    loss.backward()
    assert seen == {"weight": torch.bfloat16, "out": torch.bfloat16}
    assert all(
        isinstance(p, DTensor) and p.dtype == torch.float32 and p.grad.dtype == torch.float32
        for p in model.parameters()
    )
    expected = reference(x, x.roll(-1, 1))
    assert abs(loss.item() - expected.item()) < 2e-2 * expected.item()
    cfg = load_config(None, [])
    opt = build_optimizer(model, cfg.train)
    assert opt.defaults["fused"] is True
    opt.step()  # fused AdamW on DTensor shards
    assert all(torch.isfinite(p.to_local()).all() for p in model.parameters())


def test_compiled_blocks_share_one_graph_and_do_not_recompile(tmp_path):
    """parallel.compile: each block is compiled with inductor; the blocks share the compiled code, and after
    the warm-up steps a training step compiles nothing new (no recompilation)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    trainer = _trainer(_config(tmp_path, "--parallel.compile=true"))
    for _ in range(2):
        trainer.train_step(trainer._micro_batches())
    warm = {**counters["stats"], **{f"frames_{k}": v for k, v in counters["frames"].items()}}
    n_layers = len(trainer.model.layers)
    assert 1 <= warm["unique_graphs"] < n_layers, warm  # one graph for all blocks, not one per block
    for _ in range(3):
        trainer.train_step(trainer._micro_batches())
    after = {**counters["stats"], **{f"frames_{k}": v for k, v in counters["frames"].items()}}
    assert after == warm  # no frame compiled again, no new graph


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_steady_state_step_does_not_sync_the_host(tmp_path, compiled):
    """A training step after warm-up (data to the GPU, forward, backward, clipping, fused AdamW, LR schedule)
    makes no call that waits for the GPU: the host runs ahead and keeps the GPU's queue full."""
    trainer = _trainer(_config(tmp_path, f"--parallel.compile={str(compiled).lower()}"))
    for _ in range(3):
        trainer.train_step(trainer._micro_batches())
    assert host_syncs(
        lambda: trainer.train_step(trainer._micro_batches()).item()
    )  # the detector sees .item()
    syncs = host_syncs(lambda: trainer.train_step(trainer._micro_batches()))
    assert not syncs, "\n\n".join(syncs)


def test_per_step_collectives_do_not_sync_the_host(tmp_path, nccl_group_of_one):
    """In a job with a process group the trainer also runs, after every step, the preemption check (an
    all-reduce over all ranks) and the poll of a background checkpoint save: neither makes the host wait for
    the step just queued. A signal still stops every rank, one step later on GPUs."""
    trainer = _trainer(_config(tmp_path))
    device = trainer.ctx.device

    def loop_body():  # Trainer.fit between two log steps, without a checkpoint due
        trainer.train_step(trainer._micro_batches())
        trainer.checkpoints.poll(device)
        return trainer.checkpointer.preemption.agreed(device)

    try:
        for _ in range(3):
            assert not loop_body()
        syncs = host_syncs(loop_body)
        assert not syncs, "\n\n".join(syncs)
        os.kill(os.getpid(), signal.SIGUSR2)
        assert trainer.checkpointer.preemption.received == "SIGUSR2"
        assert [loop_body(), loop_body()] == [False, True]
    finally:
        trainer.checkpointer.preemption.restore()


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_peak_memory_within_plan(tmp_path, compiled):
    """torch.cuda.max_memory_allocated over a training step is within 10 % of `exatrain plan`'s per-GPU total
    for the same layout (single GPU, bf16 autocast, fp32 AdamW state)."""
    cfg = _config(
        tmp_path,
        "--model.size=medium",
        "--data.seq_len=1024",
        "--train.micro_batch_size=8",
        "--train.global_batch_size=8",
        f"--parallel.compile={str(compiled).lower()}",
    )
    gc.collect()  # earlier tests' trainers (reference cycles) must not count
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    trainer = _trainer(cfg)
    plan = make_plan(cfg, 1, vocab_size=trainer.corpus.vocab_size)
    for _ in range(2):  # the first step creates AdamW's state
        trainer.train_step(trainer._micro_batches())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    trainer.train_step(trainer._micro_batches())
    torch.cuda.synchronize()
    peak, planned = torch.cuda.max_memory_allocated() - base, plan.peak.total
    detail = {
        k: getattr(plan.peak, k) / 2**20
        for k in ("params", "grads", "optimizer", "transient", "weight_copies", "activations")
    }
    print(f"peak {peak / 2**20:.0f} MiB, plan {planned / 2**20:.0f} MiB, plan detail (MiB) {detail}")
    assert abs(peak - planned) <= 0.10 * planned, (peak / 2**20, planned / 2**20, detail)


def test_doctor_reports_nccl_network_from_its_own_log(exatrain_cli, tmp_path):
    """`exatrain doctor` on one CUDA rank sets up NCCL itself (a one-rank communicator) with NCCL_DEBUG=INFO
    into a file of its own, and reports the network that log names, without `--nccl-log`."""
    logs = tmp_path / "nccl"
    one_gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[
        0
    ]  # one rank seeing 8 GPUs fails a check
    r = exatrain_cli(
        "doctor", "--device=cuda", f"--nccl-log-dir={logs}", env={"CUDA_VISIBLE_DEVICES": one_gpu}
    )
    assert r.returncode == 0, r.stdout + r.stderr
    log = (logs / "nccl-rank0.log").read_text()
    assert "NCCL INFO" in log and "Using network" in log
    network = re.search(r"NCCL INFO Using network (.+?)\s*$", log, re.M).group(1)
    family = {"Socket": "Socket", "IB": "IB", "IBext": "IB"}.get(
        network, "OFI"
    )  # aws-ofi-nccl: "AWS Libfabric"
    assert re.search(
        rf"^NCCL network \(each GPU rank's NCCL_DEBUG=INFO log\): {family}\b.*, on rank\(s\) 0$",
        r.stdout,
        re.M,
    ), r.stdout
