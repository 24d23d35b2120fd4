"""Step time of the exatrain trainer against a hand-written PyTorch loop, one process, same everything.

Both sides train the same model (same seed, size, data windows, batch, AdamW settings, gradient
clipping and LR schedule) and log the loss every 10 steps (`.item()`). The exatrain side is timed as whole
`Trainer.fit()` steps: everything the loop does per step (sampler, batch assembly, the step, the loss
reduction and `.item()` on log steps, metrics records, checkpoint polling, the preemption check). A block is
one `fit()` call running `--steps` more steps; the per-fit costs (banner, final evaluation of one batch,
weights digest) are measured by a `fit()` call running no step in the same repetition and subtracted.
The progress lines are switched off (both sides keep the loss; exatrain also writes its metrics records).
Repetitions are interleaved (A B, B A, ...) so machine noise hits both alike; the result is the ratio of
median step times (exatrain / plain), by wall time and by the process's CPU time (benchmarks/clock.py: the
latter stays meaningful on a shared machine). Goal: <= 1.02.

    .venv/bin/python -m benchmarks.overhead [--size small] [--steps 20] [--reps 7]
"""

from __future__ import annotations

import dataclasses
import tempfile

import torch

from benchmarks._cpu_trainer import alternating, arguments, cpu_config, describe
from benchmarks.clock import Span, now, report
from exatrain.data import make_batch
from exatrain.distributed import init_distributed, seed_everything
from exatrain.engines.optim import build_optimizer, build_scheduler
from exatrain.env import detect_environment
from exatrain.models.transformer import build_model
from exatrain.train.entry import prepare_data
from exatrain.train.trainer import Trainer


def plain_loop(cfg, corpus, batches, log):
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
        if (i + 1) % cfg.train.log_every == 0:
            log.append(loss.item())
        return loss.detach()

    return step


def fit_block(trainer, steps: int) -> Span:
    """Wall and CPU time of one `fit()` call that runs `steps` more steps (0: only the per-fit costs)."""
    trainer.cfg = dataclasses.replace(
        trainer.cfg, train=dataclasses.replace(trainer.cfg.train, steps=trainer.step + steps)
    )
    t0 = now()
    trainer.fit()
    return now() - t0


def exatrain_loop(trainer):
    """Per-step time of whole fit() steps: a fit() of n steps minus a fit() of none, over n."""

    def block(start, n):
        return (fit_block(trainer, n) - fit_block(trainer, 0)) / n

    return block


def timed(step, start, n):
    t0 = now()
    for i in range(start, start + n):
        step(i)
    return (now() - t0) / n


def plain_block(step):
    return lambda start, n: timed(step, start, n)


def main():
    a = arguments(__doc__.splitlines()[0], size="small").parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        extra = (
            "--train.eval_at_start=false",
            "--train.eval_every=0",
            "--train.eval_batches=1",
            "--train.save_model=false",
            "--train.log_every=10",
        )
        cfg = cpu_config(a, tmp, extra)
        ctx = init_distributed(detect_environment({}), "cpu")
        corpus = prepare_data(cfg)
        trainer = Trainer(cfg, ctx, corpus)
        start = trainer.sampler.state_dict()
        batches = [mbs[0] for mbs in trainer.sampler.iter_steps(64)]  # the same windows for both sides
        trainer.sampler.load_state_dict(start)
        trainer.progress.enabled = (
            False  # no progress lines on stdout (the metrics records are still written)
        )
        sides = {
            "exatrain": exatrain_loop(trainer),
            "plain": plain_block(plain_loop(cfg, corpus, batches, [])),
        }
        for block in sides.values():
            block(0, 3)  # warm-up
        times = {k: [] for k in sides}
        for rep, name in alternating(list(sides), a.reps):
            times[name].append(sides[name](rep * a.steps, a.steps))
        print(describe(a, sides=" (exatrain: whole fit() steps)"))
        print(report(times, "exatrain", "plain", "goal <= 1.02"))


if __name__ == "__main__":
    main()
