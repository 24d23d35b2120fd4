"""Tokens/s, MFU and peak memory of the reference model on ONE GPU: exatrain's training step vs a plain loop.

Like for like, in the same process, on the same random token batches, repetitions interleaved (plain,
exatrain, plain, exatrain, ...) so that clock and thermal drift hit both sides alike:
  * plain: what a user writes by hand: the model on the GPU (fp32 parameters), torch.compile of each block
    (`block.compile()`), autocast bf16, torch.optim.AdamW(fused=True), torch's clip_grad_norm_;
  * exatrain: the step `exatrain train` runs on one GPU: the model built and loaded on the CPU and laid out
    by exatrain.parallelize through exatrain.train.model_layout (torch.compile per block, the same
    granularity), DataParallelEngine.train_step under the trainer's autocast (bf16), exatrain's
    clip_grad_norm_, build_optimizer's AdamW, the LR scheduler;
  * exatrain_foreach (optional, --variants): exatrain with torch's default (foreach) AdamW instead of the
    fused one;
  * fsdp (optional): exatrain's FSDP2 on a 1-GPU mesh with bf16 parameters and fp32 reduction
    (apply_fsdp): the per-GPU compute of an FSDP job without the network.
MFU = tokens/s x FLOPs per token / peak. FLOPs per token = 6 N + 12 L D T (PaLM appendix B: N = parameters
outside the embedding tables, i.e. the matmul weights incl. the output head; the attention term counts the
full T x T score and value products, no causal halving). Peak: --peak-tflops (H100 SXM dense bf16: 989).
Peak memory: torch.cuda.max_memory_allocated over one step of a side, minus what was allocated before that
side was built (the other side's resident state), next to `exatrain plan`'s per-GPU total for the layout.

A size is a named one (medium, large, xl, ...) or DIMxLAYERSxHEADS, e.g. 2048x24x16 (the shape of a published
run such as MPT-1b; the MLP stays 4 x DIM with GELU, like MPT's).

    python -m benchmarks.gpu_mfu [--sizes medium,xl] [--seq-len 2048] [--steps 10] [--reps 3]
                                 [--peak-tflops 989] [--profile DIR]

Needs a CUDA GPU; without one it exits with code 2 and says so (--device cpu runs a tiny smoke test of the
code path, no measurement).
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import sys
import time

BATCH = {"tiny": 8, "small": 32, "medium": 32, "large": 16, "xl": 8}  # samples per step at T = 2048
GIB = 2**30


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="medium,xl")
    p.add_argument("--variants", default="plain,exatrain", help="comma list of " + ", ".join(SIDES))
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--dropout", type=float, default=0.0, help="the model's dropout, every side")
    p.add_argument("--batch", type=int, default=0, help="samples per step (0 = a per-size default)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per side and repetition")
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation)")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="peak dense bf16 TFLOP/s of the GPU")
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument(
        "--profile",
        default="",
        help="write a torch.profiler trace of one exatrain step of the last "
        "size to this folder and print its top kernels",
    )
    p.add_argument(
        "--device", default="cuda", choices=["cuda", "cpu"], help="cpu: smoke test of the code only"
    )
    return p.parse_args(argv)


def flops_per_token(model, seq_len: int) -> float:
    """6 N + 12 L D T (see the module docstring)."""
    s = model.shape
    return 6 * model.num_params(embeddings=False) + 12 * s.n_layers * s.dim * seq_len


def size_overrides(size: str) -> list[str]:
    """The [model] options of a size: a named one, or DIMxLAYERSxHEADS on top of the xl preset."""
    if size[0].isdigit():
        dim, layers, heads = size.split("x")
        shape = {"dim": dim, "n_layers": layers, "n_heads": heads}
        return ["--model.size=xl", *(f"--model.{key}={value}" for key, value in shape.items())]
    return [f"--model.size={size}"]


def build_model(size, vocab, seq_len, dropout=0.0):
    """The reference model of a size (size_overrides), as the trainer builds it from its [model] section."""
    from exatrain.config import load_config
    from exatrain.models import configured_shape
    from exatrain.models.transformer import TransformerLM

    shape = configured_shape(load_config(None, size_overrides(size)).model)
    return TransformerLM(shape, vocab, seq_len, dropout)


def exatrain_config(size, a, batch):
    """The configuration of a one-GPU `exatrain train` run of this size (compile per block)."""
    from exatrain.config import load_config

    return load_config(
        None,
        [
            *size_overrides(size),
            f"--data.seq_len={a.seq_len}",
            "--parallel.compile=true",
            f"--parallel.compile_backend={a.compile_backend}",
            f"--train.micro_batch_size={batch}",
            f"--train.global_batch_size={batch}",
            "--train.precision=bf16",
            f"--model.dropout={a.dropout}",
        ],
    )


@functools.cache
def one_rank_context(device_type: str):
    """exatrain.init for this one process (no launcher: a world of one, no process group), once."""
    import exatrain

    return exatrain.init(device=device_type, quiet=True, affinity="off", environ={})


def exatrain_side(size, a, device, full_state, batch):
    """The step `exatrain train --nproc=1` runs (Trainer.train_step with a DataParallelEngine)."""
    import torch

    import exatrain
    from exatrain.engines.optim import build_optimizer, build_scheduler
    from exatrain.train.data_parallel_engine import DataParallelEngine
    from exatrain.train.model_layout import apply_layout, lm_from_config

    ctx = one_rank_context(device.type)
    cfg = exatrain_config(size, a, batch)
    reference = lm_from_config(cfg, a.vocab)  # as the trainer's reference_model: on the CPU, then laid out
    reference.load_state_dict(full_state)
    model = apply_layout(reference, ctx, cfg.parallel)
    engine = DataParallelEngine(
        model, ctx.device, 0, False, lambda: torch.autocast(ctx.device.type, dtype=torch.bfloat16)
    )
    opt = build_optimizer(engine.model_parts, cfg.train)
    sched = build_scheduler(opt, cfg.train)
    params = list(model.parameters())
    clip_grad_norm_ = exatrain.clip_grad_norm_

    def step(x, y):  # Trainer.train_step
        loss = engine.train_step([(x, y)])
        clip_grad_norm_(params, cfg.train.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def exatrain_foreach_side(size, a, device, full_state, batch):
    """exatrain's step with torch's default AdamW (foreach), as build_optimizer chose before it used the fused
    kernel on GPUs: shows what that change is worth."""
    from exatrain.train import optim

    chosen = optim.fused_ok
    optim.fused_ok = lambda params: False
    try:
        return exatrain_side(size, a, device, full_state, batch)
    finally:
        optim.fused_ok = chosen


def fsdp_side(size, a, device, full_state, batch):
    """exatrain's FSDP2 layout on a 1-GPU mesh with bf16 parameters and fp32 reduction (needs a process
    group)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from exatrain.distributed.grad_norm import clip_grad_norm_
    from exatrain.distributed.parallelize import apply_compile, apply_fsdp
    from exatrain.distributed.state_dict import load_full_state_dict
    from exatrain.engines.optim import build_optimizer

    cfg = exatrain_config(size, a, batch)
    with torch.device("meta"):
        model = build_model(size, a.vocab, a.seq_len, a.dropout)
    apply_compile(model.layers, a.compile_backend)
    mesh = init_device_mesh(device.type, (1,), mesh_dim_names=("dp_shard",))
    apply_fsdp(model, model.layers, mesh, True, torch.bfloat16, False, pin_memory=device.type == "cuda")
    load_full_state_dict(model, full_state, device)
    opt = build_optimizer(model, cfg.train)
    params = list(model.parameters())

    def step(x, y):
        loss = model(x, y)
        loss.backward()
        clip_grad_norm_(params, cfg.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def plain_side(size, a, device, full_state, batch):
    """What a user writes by hand: per-block compile, autocast bf16, fused AdamW, clipping."""
    import torch

    model = build_model(size, a.vocab, a.seq_len, a.dropout)
    model.load_state_dict(full_state)
    model.to(device)
    for block in model.layers.values():
        block.compile(backend=a.compile_backend)
    opt = torch.optim.AdamW(
        model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, fused=device.type == "cuda"
    )

    def step(x, y):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


SIDES = {
    "plain": plain_side,
    "exatrain": exatrain_side,
    "exatrain_foreach": exatrain_foreach_side,
    "fsdp": fsdp_side,
}


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(step, batches, steps, device) -> float:
    """Seconds for `steps` steps (the GPU drained before and after)."""
    _sync(device)
    t0 = time.perf_counter()
    for i in range(steps):
        step(*batches[i % len(batches)])
    _sync(device)
    return time.perf_counter() - t0


def build_and_warm(name, size, a, device, full_state, batches, batch):
    """Build one side, run its warm-up steps (compilation), and measure its peak memory over one step."""
    import torch

    base = torch.cuda.memory_allocated() if device.type == "cuda" else 0
    t0 = time.perf_counter()
    step = SIDES[name](size, a, device, full_state, batch)
    losses = [float(step(*batches[i % len(batches)])) for i in range(a.warmup)]
    peak = 0.0
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step(*batches[0])
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / GIB
    print(
        f"  {size:6s} {name:8s} built and warmed up in {time.perf_counter() - t0:.0f} s "
        f"(warm-up losses {', '.join(f'{x:.3f}' for x in losses)}); peak memory of one step {peak:.2f} GiB",
        flush=True,
    )
    return step, peak


def plan_total(size, a, batch) -> float:
    """`exatrain plan`'s per-GPU total (GiB) for the exatrain side's layout (one GPU), or 0 if it fails."""
    from exatrain.tools.plan import make_plan

    try:
        return make_plan(exatrain_config(size, a, batch), 1, vocab_size=a.vocab).peak.total / GIB
    except Exception as e:  # noqa: BLE001 - the benchmark reports the plan, it does not depend on it
        print(f"  plan failed: {e}", flush=True)
        return 0.0


def run_size(size, a, device, plans) -> dict:
    import torch

    torch.manual_seed(0)
    reference = build_model(size, a.vocab, a.seq_len)
    full_state, fpt = reference.state_dict(), flops_per_token(reference, a.seq_len)
    n_params = reference.num_params()
    del reference
    batch = a.batch or BATCH.get(size, 8)
    tokens = batch * a.seq_len
    gen = torch.Generator(device="cpu").manual_seed(1)
    batches = [
        (lambda t: (t, t.roll(-1, 1)))(torch.randint(a.vocab, (batch, a.seq_len), generator=gen).to(device))
        for _ in range(4)
    ]
    names = a.variants.split(",")
    steps, peaks = {}, {}
    for name in names:
        steps[name], peaks[name] = build_and_warm(name, size, a, device, full_state, batches, batch)
    del full_state
    rates = {n: [] for n in names}
    for rep in range(a.reps):
        order = names if rep % 2 == 0 else names[::-1]  # alternate who goes first
        for name in order:
            rates[name].append(a.steps * tokens / timed(steps[name], batches, a.steps, device))
    print(
        f"  {size} ({n_params / 1e6:.0f}M params, {fpt / 1e9:.2f} GFLOP/token, batch {batch} x {a.seq_len}), "
        f"{a.reps} interleaved reps x {a.steps} steps; plan's per-GPU total for the exatrain layout "
        f"{plans.get(size, 0):.2f} GiB",
        flush=True,
    )
    result = {}
    for name in names:
        med = statistics.median(rates[name])
        mfu = med * fpt / (a.peak_tflops * 1e12)
        result[name] = {"tokens_s": med, "mfu": mfu, "peak_gib": peaks[name]}
        print(
            f"  {size:6s} {name:8s} {med:12,.0f} tokens/s (reps: "
            f"{', '.join(f'{r:,.0f}' for r in rates[name])})  "
            f"MFU {mfu:6.1%}  step {tokens / med * 1e3:7.1f} ms  peak memory {peaks[name]:.2f} GiB",
            flush=True,
        )
    if "plain" in names:
        for name in names:
            if name != "plain":
                ratios = [x / p for x, p in zip(rates[name], rates["plain"])]
                print(
                    f"  {size:6s} ratio {name}/plain tokens/s = {statistics.median(ratios):.3f} "
                    f"(per rep: {', '.join(f'{r:.3f}' for r in ratios)})",
                    flush=True,
                )
    if "exatrain" in names and plans.get(size):
        print(f"  {size:6s} exatrain peak memory / plan = {peaks['exatrain'] / plans[size]:.3f}", flush=True)
    if a.profile and size == a.sizes.split(",")[-1]:
        profile_step(steps.get("exatrain") or steps[names[-1]], batches, device, a.profile, size)
    steps.clear()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def profile_step(step, batches, device, folder, size) -> None:
    """torch.profiler over two steps: a gzipped Chrome trace, the top GPU kernels, and GPU-busy time vs
    wall."""
    import gzip
    import shutil
    from pathlib import Path

    import torch
    from torch.profiler import ProfilerActivity, profile

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    step(*batches[0])
    _sync(device)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        for i in range(2):
            step(*batches[i])
        _sync(device)
    wall = (time.perf_counter() - t0) / 2
    trace = out / f"trace-{size}.json"
    prof.export_chrome_trace(str(trace))
    with trace.open("rb") as f, gzip.open(f"{trace}.gz", "wb") as g:
        shutil.copyfileobj(f, g)
    trace.unlink()
    events = prof.key_averages()
    print(
        events.table(
            sort_by="self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total",
            row_limit=30,
            max_name_column_width=90,
        ),
        flush=True,
    )
    if device.type == "cuda":
        busy = (
            sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
            / 2e6
        )
        print(
            f"profile: {wall * 1e3:.1f} ms per step (wall, profiled), GPU kernels busy {busy * 1e3:.1f} ms "
            f"({busy / wall:.1%}); trace {trace}.gz",
            flush=True,
        )


def _one_rank_group(device):
    """FSDP needs a process group: a group of one on this machine (an in-process store: no rendezvous)."""
    import torch.distributed as dist

    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1
    )


def main(argv=None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_mfu: needs a CUDA GPU, and torch sees none on this machine "
            "(torch.cuda.is_available() is False); "
            "run it on a GPU node, or --device cpu for a smoke test of the code path",
            file=sys.stderr,
        )
        return 2
    device = torch.device(a.device)
    if device.type == "cuda":
        torch.cuda.set_device(0)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (smoke test, MFU meaningless)"
    print(
        f"{name}, torch {torch.__version__}, peak {a.peak_tflops:g} TFLOP/s bf16, FLOPs/token = 6N + 12LDT, "
        f"{a.reps} interleaved reps x {a.steps} timed steps after {a.warmup} warm-up steps per side",
        flush=True,
    )
    sizes = a.sizes.split(",")
    plans = {s: plan_total(s, a, a.batch or BATCH.get(s, 8)) for s in sizes}  # before any process group
    one_rank_context(device.type)  # before the fsdp side's group: exatrain.init refuses to start beside one
    group = "fsdp" in a.variants.split(",")
    if group:
        _one_rank_group(device)
    try:
        for size in sizes:
            run_size(size, a, device, plans)
    finally:
        if group:
            torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
