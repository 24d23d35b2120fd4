"""Where one training step's GPU memory goes on one GPU (autocast bf16, AdamW), next to `exatrain plan`'s \
rows.

For each case the model is built as `exatrain train --nproc=1` builds it (train.build), warmed up for two
steps (AdamW's state exists), and then one step is measured with torch.cuda.memory_allocated at fixed points:
resident state before the step (parameters + AdamW), activations kept at the end of forward (all of them; per
block and for the head, in units of B*T*D bytes, B*T*D = samples x tokens x model width), the peak during the
step above the resident state, and the gradients after backward.

    python -m benchmarks.gpu_memory [--cases medium:1024:8:512,xl:2048:8:32000] [--compile both]

A case is size:seq_len:batch:vocab. Needs a CUDA GPU (exit code 2 without one).
"""

from __future__ import annotations

import argparse
import gc
import sys

MIB = 2**20


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="medium:1024:8:512,xl:2048:8:32000")
    p.add_argument("--compile", default="both", choices=["both", "yes", "no"])
    return p.parse_args(argv)


def config(size, seq, batch, compiled):
    from exatrain.config import load_config

    return load_config(
        None,
        [
            f"--model.size={size}",
            f"--data.seq_len={seq}",
            f"--train.micro_batch_size={batch}",
            f"--train.global_batch_size={batch}",
            f"--parallel.compile={str(compiled).lower()}",
        ],
    )


def measure(size, seq, batch, vocab, compiled, full_state) -> dict:
    """Memory marks of one step (bytes)."""
    import torch

    from benchmarks.gpu_mfu import one_rank_context
    from exatrain.engines.optim import build_optimizer
    from exatrain.train.model_layout import apply_layout, lm_from_config

    device = torch.device("cuda", 0)
    cfg = config(size, seq, batch, compiled)
    model = lm_from_config(cfg, vocab)  # as the trainer: built and loaded on the CPU, then laid out
    model.load_state_dict(full_state)
    model = apply_layout(model, one_rank_context("cuda"), cfg.parallel)
    opt = build_optimizer(model, cfg.train)
    x = torch.randint(vocab, (batch, seq), device=device)
    y = x.roll(-1, 1)

    def forward():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return model(x, y)  # noqa: F821 (bound above; ruff misreads the later `del model`)

    for _ in range(2):
        forward().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    marks = {"resident": torch.cuda.memory_allocated()}

    # hooks on modules outside the compiled blocks: the position embedding (just before block 0's input is
    # formed) and the final norm (right after the last block)
    def mark(name):
        def hook(*_):  # returns None: a hook's return value would replace the module's input or output
            marks.setdefault(name, torch.cuda.memory_allocated())

        return hook

    hooks = [
        model.pos_embeddings.register_forward_hook(mark("embedded")),
        model.norm.register_forward_pre_hook(mark("blocks_done")),
    ]
    torch.cuda.reset_peak_memory_stats()
    loss = forward()
    torch.cuda.synchronize()
    marks["forward_done"] = torch.cuda.memory_allocated()
    marks["forward_peak"] = torch.cuda.max_memory_allocated()
    loss.backward()
    torch.cuda.synchronize()
    marks["step_peak"] = torch.cuda.max_memory_allocated()
    marks["backward_done"] = torch.cuda.memory_allocated()
    for h in hooks:
        h.remove()
    opt.zero_grad(set_to_none=True)
    if not compiled:
        print_saved_tensors(model, forward, batch * seq * model.shape.dim)
    del model, opt, loss
    return marks


def print_saved_tensors(model, forward, btd) -> None:
    """Eager only: each tensor autograd saves for backward in block 0 and in the head (after the last block),
    once per storage, with its size in B*T*D bytes; parameters (saved as they are) are marked."""
    import torch

    region, seen = ["embed"], {}
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def set_region(name):
        def hook(*_):
            region[0] = name

        return hook

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen[ptr] = (
                region[0],
                str(t.dtype).replace("torch.", ""),
                tuple(t.shape),
                t.untyped_storage().nbytes(),
                ptr in params,
            )
        return t

    hooks = [
        model.layers["0"].register_forward_pre_hook(set_region("block0")),
        model.layers["0"].register_forward_hook(set_region("blocks")),
        model.norm.register_forward_pre_hook(set_region("head")),
    ]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = forward()
    for h in hooks:
        h.remove()
    del loss
    for name in ("embed", "block0", "head"):
        items = [v for v in seen.values() if v[0] == name]
        total = sum(v[3] for v in items if not v[4])
        print(
            f"  saved in {name}: {total / btd:.2f} BTD bytes without parameters; "
            + "; ".join(f"{d} {list(sh)} {n / btd:.2f}{' (param)' if p else ''}" for _, d, sh, n, p in items),
            flush=True,
        )


def report(size, seq, batch, vocab, compiled, m, plan) -> None:
    from exatrain.models import model_shape

    shape = model_shape(size)
    btd = batch * seq * shape.dim
    blocks = (m["blocks_done"] - m["embedded"]) / shape.n_layers
    head = m["forward_done"] - m["blocks_done"]
    acts = m["forward_done"] - m["resident"]
    grads = m["backward_done"] - m["resident"]
    peak = m["step_peak"]
    print(
        f"{size}:{seq}:{batch}:{vocab} {'compiled' if compiled else 'eager   '}  resident "
        f"{m['resident'] / MIB:8.0f} MiB  "
        f"activations {acts / MIB:8.0f} MiB (per block {blocks / btd:5.2f} BTD bytes, head "
        f"{head / MIB:6.0f} MiB = "
        f"{head / (batch * seq * vocab):5.2f} B*T*V bytes)  grads {grads / MIB:7.0f} MiB  "
        f"step peak {peak / MIB:8.0f} MiB = resident + activations + "
        f"{(peak - m['forward_done']) / MIB:.0f} MiB  "
        f"| plan total {plan.total / MIB:8.0f} MiB (params {plan.params / MIB:.0f}, grads "
        f"{plan.grads / MIB:.0f}, "
        f"AdamW {plan.optimizer / MIB:.0f}, weight copies {plan.weight_copies / MIB:.0f}, "
        f"activations {plan.activations / MIB:.0f})  peak/plan {peak / plan.total:.3f}",
        flush=True,
    )


def main(argv=None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_memory: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    from exatrain.models.transformer import build_model
    from exatrain.tools.plan import make_plan

    torch.cuda.set_device(0)
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; autocast bf16, fp32 "
        "parameters, fused AdamW",
        flush=True,
    )
    modes = {"both": (False, True), "yes": (True,), "no": (False,)}[a.compile]
    cases = a.cases.split(",")
    if len(cases) * len(modes) > 1:  # one process per case: nothing of an earlier case stays allocated
        import subprocess

        for case in cases:
            for compiled in modes:
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "benchmarks.gpu_memory",
                        "--cases",
                        case,
                        "--compile",
                        "yes" if compiled else "no",
                    ],
                    check=True,
                )
        return 0
    for case in cases:
        size, seq, batch, vocab = case.split(":")
        seq, batch, vocab = int(seq), int(batch), int(vocab)
        torch.manual_seed(0)
        full_state = build_model(size, vocab, seq).state_dict()
        for compiled in modes:
            plan = make_plan(config(size, seq, batch, compiled), 1, vocab_size=vocab).peak
            marks = measure(size, seq, batch, vocab, compiled, full_state)
            report(size, seq, batch, vocab, compiled, marks, plan)
            gc.collect()
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
