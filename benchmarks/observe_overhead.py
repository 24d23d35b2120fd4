"""Cost of observability in the trainer's step: StepMetrics (phases, device-side loss, a log step every
--log-every steps), metrics.jsonl, TensorBoard event files and the GPU sampler ON vs all of it OFF.

One process, one Trainer (same model, data, optimizer); both sides run the trainer's own step pieces,
the ON side wrapped as Trainer.fit wraps them. Repetitions are interleaved (A B, B A, ...) so machine noise
hits both alike; the result is the ratio of median step times (on / off), by wall time and by the process's
CPU time, which counts the writer's and the sampler's threads too (benchmarks/clock.py). Goal: <= 1.01.
Without a GPU the sampler finds no GPU tool and its thread ends at once (say so next to any figure).

    .venv/bin/python -m benchmarks.observe_overhead [--size small] [--steps 20] [--reps 7] [--log-every 10]

(The Trainer catches SIGTERM as a pre-timeout signal: stop a run with Ctrl-C or SIGKILL.)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from benchmarks.clock import now, report
from exatrain.config import load_config
from exatrain.distributed import init_distributed
from exatrain.env import detect_environment
from exatrain.observe.gpu_monitor import GpuMonitor
from exatrain.observe.metrics import MetricsFanout, MetricsLog
from exatrain.observe.step_metrics import StepMetrics
from exatrain.observe.tensorboard import TensorBoardLog, tensorboard_available
from exatrain.train.entry import prepare_data
from exatrain.train.trainer import Trainer


def off_side(trainer):
    """The bare step: batches, forward/backward, optimizer."""

    def step():
        trainer.engine.train_step(trainer._micro_batches())
        trainer._optimizer_step()

    return step


def on_side(trainer, metrics: StepMetrics, log: MetricsFanout, tokens: float, samples: float):
    """The same step as Trainer.fit runs it: timed phases, loss kept on the device, records on log steps."""

    def step():
        with metrics.phase("data"):
            batches = trainer._micro_batches()
        with metrics.phase("forward_backward"):
            loss = trainer.engine.train_step(batches)
        with metrics.phase("optimizer"):
            trainer._optimizer_step()
        metrics.add_loss(loss)
        record = metrics.end_step(tokens=tokens, samples=samples)
        if record is not None:
            log.write(kind="train", **record, lr=trainer.scheduler.get_last_lr()[0])

    return step


def timed(step, n: int) -> float:
    t0 = now()
    for _ in range(n):
        step()
    return (now() - t0) / n


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="small")
    p.add_argument("--steps", type=int, default=20, help="steps per timed block")
    p.add_argument("--reps", type=int, default=7, help="interleaved repetitions")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--log-every", type=int, default=10)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(
            None,
            [
                f"--model.size={a.size}",
                f"--data.seq_len={a.seq_len}",
                f"--run.dir={tmp}/run",
                f"--train.global_batch_size={a.batch}",
                f"--train.micro_batch_size={a.batch}",
                "--train.device=cpu",
                f"--train.steps={10**6}",
                "--observe.tensorboard=off",
                "--observe.monitor_interval_s=0",
            ],
        )
        ctx = init_distributed(detect_environment({}), "cpu")
        trainer = Trainer(cfg, ctx, prepare_data(cfg))
        run = Path(tmp) / "on"
        log = MetricsFanout(
            MetricsLog(run / "metrics.jsonl", enabled=True),
            TensorBoardLog(run / "tensorboard", enabled=tensorboard_available()),
        )
        monitor = GpuMonitor(run, interval_s=10.0).start()
        metrics = StepMetrics(a.log_every, ctx.device, flops_per_token=1.0)
        sides = {"on": on_side(trainer, metrics, log, a.batch * a.seq_len, a.batch), "off": off_side(trainer)}
        for step in sides.values():
            timed(step, 3)  # warm-up
        times = {k: [] for k in sides}
        for rep in range(a.reps):
            for name in list(sides) if rep % 2 == 0 else list(reversed(sides)):
                times[name].append(timed(sides[name], a.steps))
        monitor.stop()
        log.close()
        print(
            f"model {a.size}, seq_len {a.seq_len}, batch {a.batch}, {a.reps} x {a.steps} steps "
            "per side, log every "
            f"{a.log_every}, tensorboard {'on' if tensorboard_available() else 'NOT INSTALLED'}, torch "
            f"{torch.__version__}, {torch.get_num_threads()} threads"
        )
        print(report(times, "on", "off", "goal <= 1.01"))


if __name__ == "__main__":
    main()
