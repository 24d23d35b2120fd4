"""Shared set-up of the CPU overhead benchmarks (`overhead.py`, `observe_overhead.py`,
`heartbeat_overhead.py`): their common options, the configuration of a one-rank CPU trainer of the reference
model, and the alternating order of the two sides each compares.

Not a benchmark itself (the leading underscore keeps it out of `ls benchmarks/*.py` listings of scripts).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import torch

from exatrain.config import load_config

# options that keep the observability extras out of a side that does not time them
QUIET_OBSERVE = ("--observe.tensorboard=off", "--observe.monitor_interval_s=0")


def arguments(description: str, size: str) -> argparse.ArgumentParser:
    """The options every overhead benchmark takes (model size, steps per timed block, interleaved
    repetitions, sequence length, batch); each script adds its own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--size", default=size)
    p.add_argument("--steps", type=int, default=20, help="steps per timed block")
    p.add_argument("--reps", type=int, default=7, help="interleaved repetitions")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    return p


def cpu_config(a: argparse.Namespace, tmp: str, extra: tuple[str, ...] = ()):
    """The configuration of one CPU rank training the reference model at the benchmark's size, sequence
    length and batch (one micro-batch per step, steps enough never to end), writing under `tmp`."""
    return load_config(
        None,
        [
            f"--model.size={a.size}",
            f"--data.seq_len={a.seq_len}",
            f"--run.dir={tmp}/run",
            f"--train.global_batch_size={a.batch}",
            f"--train.micro_batch_size={a.batch}",
            "--train.device=cpu",
            f"--train.steps={10**6}",
            *extra,
        ],
    )


def alternating(names: list[str], reps: int) -> Iterator[tuple[int, str]]:
    """(repetition, side) in the order the sides are timed: forwards on even repetitions, backwards on odd
    ones, so that neither side always runs first (a machine's drift falls on both)."""
    for rep in range(reps):
        for name in names if rep % 2 == 0 else list(reversed(names)):
            yield rep, name


def describe(a: argparse.Namespace, *details: str, sides: str = "") -> str:
    """The first line of a benchmark's output: its shape, repetitions (`sides`: what a side's step is),
    its own `details`, torch and threads."""
    parts = [
        f"model {a.size}, seq_len {a.seq_len}, batch {a.batch}, {a.reps} x {a.steps} steps per side{sides}",
        *details,
        f"torch {torch.__version__}, {torch.get_num_threads()} threads",
    ]
    return ", ".join(parts)
