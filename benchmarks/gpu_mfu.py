"""Tokens/s and MFU of the reference model on ONE GPU: exatrain's layout code vs a plain PyTorch loop.

For each size that fits one GPU, in the same run and on the same random token batches:
  * exatrain: the model built on the meta device, torch.compile per block (exatrain.distributed.parallelize),
    FSDP2 on a 1-GPU mesh with bf16 parameters and fp32 gradient reduction (apply_fsdp), weights loaded
    with load_full_state_dict, AdamW from exatrain.train.optim, gradient clipping as the trainer does;
  * plain: the same model on the GPU, torch.compile(model), autocast(bf16), torch.optim.AdamW, clipping.
MFU = tokens/s x FLOPs per token / peak. FLOPs per token = 6 N + 12 L D T (PaLM appendix B: N = parameters
outside the embedding tables, i.e. the matmul weights incl. the output head; the attention term counts the
full T x T score and value products, no causal halving). Peak: --peak-tflops (H100 SXM dense bf16: 989).

    python -m benchmarks.gpu_mfu [--sizes medium,large,xl] [--seq-len 2048] [--steps 20] [--peak-tflops 989]

Needs a CUDA GPU; without one it exits with code 2 and says so (--device cpu runs a tiny smoke test of the
code path, no measurement).
"""

from __future__ import annotations

import argparse
import sys
import time

BATCH = {"tiny": 8, "small": 32, "medium": 32, "large": 16, "xl": 8}  # samples per step at T = 2048


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="medium,large,xl")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batch", type=int, default=0, help="samples per step (0 = a per-size default)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per side")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation)")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="peak dense bf16 TFLOP/s of the GPU")
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: smoke test of the code only")
    return p.parse_args(argv)


def flops_per_token(model, seq_len: int) -> float:
    """6 N + 12 L D T (see the module docstring)."""
    s = model.shape
    return 6 * model.num_params(embeddings=False) + 12 * s.n_layers * s.dim * seq_len


def exatrain_side(size, a, device, full_state):
    """exatrain's path: meta build -> parallelize (compile) -> FSDP on one GPU (bf16) -> load weights."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from exatrain.config import load_config
    from exatrain.distributed.parallel_dims import ParallelDims
    from exatrain.distributed.parallelize import apply_fsdp, load_full_state_dict, parallelize
    from exatrain.models.transformer import build_model
    from exatrain.train.optim import build_optimizer

    cfg = load_config(None, [f"--model.size={size}", "--parallel.compile=true",
                             f"--parallel.compile_backend={a.compile_backend}"])
    dims = ParallelDims.from_config(cfg.parallel, 1)
    with torch.device("meta"):
        model = build_model(size, a.vocab, a.seq_len)
    parallelize(model, model.layers, dims, cfg.parallel, None, device.type)  # world size 1: compile only
    # FSDP on a 1-GPU mesh: ParallelDims enables FSDP only for dp_shard > 1, so apply it directly
    mesh = init_device_mesh(device.type, (1,), mesh_dim_names=("dp_shard",))
    apply_fsdp(model, model.layers, mesh, True, torch.bfloat16, False, pin_memory=device.type == "cuda")
    load_full_state_dict(model, device, full_state)
    opt = build_optimizer(model, cfg.train)

    def step(x, y):
        model(x, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def plain_side(size, a, device, full_state):
    """What a user writes by hand: compile, autocast bf16, AdamW, clipping."""
    import torch

    from exatrain.models.transformer import build_model

    model = build_model(size, a.vocab, a.seq_len)
    model.load_state_dict(full_state)
    model.to(device)
    compiled = torch.compile(model, backend=a.compile_backend)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)

    def step(x, y):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = compiled(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def tokens_per_second(step, batches, a, device) -> float:
    import torch

    for i in range(a.warmup):
        step(*batches[i % len(batches)])
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(a.steps):
        step(*batches[i % len(batches)])
    if device.type == "cuda":
        torch.cuda.synchronize()
    return a.steps * batches[0][0].numel() / (time.perf_counter() - t0)


def run_size(size, a, device):
    import gc

    import torch

    from exatrain.models.transformer import build_model

    torch.manual_seed(0)
    reference = build_model(size, a.vocab, a.seq_len)
    full_state, fpt = reference.state_dict(), flops_per_token(reference, a.seq_len)
    batch = a.batch or BATCH.get(size, 8)
    batches = [(lambda t: (t, t.roll(-1, 1)))(torch.randint(a.vocab, (batch, a.seq_len), device=device))
               for _ in range(4)]
    result = {}
    for name, side in (("plain", plain_side), ("exatrain", exatrain_side)):
        step = side(size, a, device, full_state)
        result[name] = tokens_per_second(step, batches, a, device)
        peak_mem = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0
        mfu = result[name] * fpt / (a.peak_tflops * 1e12)
        print(f"  {size:6s} {name:8s} {result[name]:12,.0f} tokens/s  MFU {mfu:6.1%}  "
              f"(batch {batch} x {a.seq_len}, {reference.num_params() / 1e6:.0f}M params, "
              f"peak memory {peak_mem:.1f} GiB)",
              flush=True)
        del step
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    print(f"  {size:6s} ratio exatrain/plain tokens/s = {result['exatrain'] / result['plain']:.3f}", flush=True)


def _one_rank_group(device):
    """FSDP needs a process group: a group of one on this machine."""
    import torch.distributed as dist

    # one rank needs no rendezvous: an in-process store
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)


def main(argv=None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu_mfu: needs a CUDA GPU, and torch sees none on this machine (torch.cuda.is_available() is False); "
              "run it on a GPU node, or --device cpu for a smoke test of the code path", file=sys.stderr)
        return 2
    device = torch.device(a.device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (smoke test, MFU meaningless)"
    print(f"{name}, torch {torch.__version__}, peak {a.peak_tflops:g} TFLOP/s bf16, FLOPs/token = 6N + 12LDT, "
          f"{a.steps} timed steps after {a.warmup} warm-up steps per side", flush=True)
    _one_rank_group(device)
    try:
        for size in a.sizes.split(","):
            run_size(size, a, device)
    finally:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
