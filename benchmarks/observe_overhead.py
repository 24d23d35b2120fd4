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

import tempfile
from pathlib import Path

from benchmarks._cpu_trainer import QUIET_OBSERVE, alternating, arguments, cpu_config, describe
from benchmarks.clock import now, report
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
    p = arguments(__doc__.splitlines()[0], size="small")
    p.add_argument("--log-every", type=int, default=10)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = cpu_config(a, tmp, QUIET_OBSERVE)
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
        for _, name in alternating(list(sides), a.reps):
            times[name].append(timed(sides[name], a.steps))
        monitor.stop()
        log.close()
        tensorboard = "on" if tensorboard_available() else "NOT INSTALLED"
        print(describe(a, f"log every {a.log_every}", f"tensorboard {tensorboard}"))
        print(report(times, "on", "off", "goal <= 1.01"))


if __name__ == "__main__":
    main()
