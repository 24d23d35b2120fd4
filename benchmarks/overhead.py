"""Step time of the exatrain trainer against a hand-written PyTorch loop, one process, same everything.

Both sides train the same model (same seed, size, data windows, batch, AdamW settings, gradient
clipping and LR schedule). Repetitions are interleaved (A B, B A, ...) so machine noise hits both alike;
the result is the ratio of median step times (exatrain / plain). Goal: <= 1.02.

    .venv/bin/python benchmarks/overhead.py [--size small] [--steps 20] [--reps 7]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from exatrain.config import load_config
from exatrain.data import make_batch
from exatrain.distributed import init_distributed, seed_everything
from exatrain.env import detect_environment
from exatrain.models.transformer import build_model
from exatrain.train.optim import build_optimizer, build_scheduler
from exatrain.train.run import prepare_data
from exatrain.train.trainer import Trainer


def plain_loop(cfg, corpus, batches):
    """A hand-written loop a user would write: returns a function running one optimizer step."""
    seed_everything(cfg.train.seed)
    model = build_model(cfg.model.size, corpus.vocab_size, cfg.data.seq_len)
    opt = build_optimizer(model, cfg.train)
    sched = build_scheduler(opt, cfg.train)
    tokens = corpus.splits["train"]

    def step(i):
        x, y = make_batch(tokens, batches[i % len(batches)], cfg.data.seq_len)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def exatrain_loop(trainer):
    """The trainer's own step: sampler, batch assembly, accumulation logic, autocast context, clipping."""
    def step(i):
        return trainer.train_step(trainer._micro_batches())

    return step


def timed(step, start, n):
    t0 = time.perf_counter()
    for i in range(start, start + n):
        step(i)
    return (time.perf_counter() - t0) / n


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="small")
    p.add_argument("--steps", type=int, default=20, help="steps per timed block")
    p.add_argument("--reps", type=int, default=7, help="interleaved repetitions")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, [f"--model.size={a.size}", f"--data.seq_len={a.seq_len}", f"--run.dir={tmp}/run",
                                 f"--train.global_batch_size={a.batch}", f"--train.micro_batch_size={a.batch}",
                                 "--train.device=cpu", f"--train.steps={10 ** 6}"])
        ctx = init_distributed(detect_environment({}), "cpu")
        corpus = prepare_data(cfg)
        trainer = Trainer(cfg, ctx, corpus)
        start = trainer.sampler.state_dict()
        batches = [mbs[0] for mbs in trainer.sampler.iter_steps(64)]  # the same windows for both sides
        trainer.sampler.load_state_dict(start)
        sides = {"exatrain": exatrain_loop(trainer), "plain": plain_loop(cfg, corpus, batches)}
        for step in sides.values():
            timed(step, 0, 3)  # warm-up
        times = {k: [] for k in sides}
        for rep in range(a.reps):
            order = list(sides) if rep % 2 == 0 else list(reversed(sides))
            for name in order:
                times[name].append(timed(sides[name], rep * a.steps, a.steps))
        med = {k: statistics.median(v) for k, v in times.items()}
        ratio = med["exatrain"] / med["plain"]
        print(f"model {a.size}, seq_len {a.seq_len}, batch {a.batch}, {a.reps} x {a.steps} steps per side, "
              f"torch {torch.__version__}, {torch.get_num_threads()} threads")
        for k in sides:
            print(f"  {k:9s} median step {med[k] * 1000:8.2f} ms  (all: {', '.join(f'{t * 1000:.1f}' for t in times[k])})")
        print(f"ratio exatrain/plain = {ratio:.3f}  (goal <= 1.02)")


if __name__ == "__main__":
    main()
