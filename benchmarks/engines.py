"""Step time of each engine relative to torch DDP, same model, same batches, 2 ranks, measured interleaved.

    .venv/bin/python benchmarks/engines.py [--rounds 5] [--steps 30] [--size tiny]

Each round runs every engine once through the real CLI (`exatrain train --nproc 2`), so a load change on the
machine hits all engines alike; the order rotates from round to round (round r starts with the r-th engine),
so no engine always runs first or last (each holds every place once in 6 rounds). At least 5 rounds. The step
time of a run is its summary's train_seconds / steps (the loop only: start-up, evaluation and model saving
excluded). Prints, per engine, the median step time and the median over the rounds of its ratio to DDP's step
time in the same round (a ratio of neighbours in time, robust to the machine's load drifting between rounds),
with the smallest and largest of those ratios. Engines whose library is missing are reported as such, not
silently left out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ENGINES = {
    "DDP": [],
    "FSDP2": ["--parallel.dp_shard=2"],
    "DeepSpeed ZeRO-1": ["--engine.name=deepspeed", "--engine.zero_stage=1"],
    "DeepSpeed ZeRO-2": ["--engine.name=deepspeed", "--engine.zero_stage=2"],
    "DeepSpeed ZeRO-3": ["--engine.name=deepspeed", "--engine.zero_stage=3"],
    "Horovod": ["--engine.name=horovod"],
}


def step_time(tmp: Path, name: str, args: list[str], a) -> float:
    run = tmp / name.replace(" ", "_")
    cmd = [
        sys.executable,
        "-m",
        "exatrain.cli.main",
        "train",
        "--nproc=2",
        f"--run.dir={run}",
        f"--model.size={a.size}",
        f"--train.steps={a.steps}",
        "--train.eval_every=0",
        "--train.eval_at_start=false",
        "--train.eval_batches=1",
        "--train.save_model=false",
        "--train.global_batch_size=16",
        "--train.micro_batch_size=8",
        f"--train.log_every={a.steps}",
        "--data.seq_len=64",
        *args,
    ]
    r = subprocess.run(
        cmd, capture_output=True, text=True, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"}
    )
    if r.returncode != 0:
        if "is not installed" in r.stderr:
            raise LookupError(r.stderr.strip().splitlines()[-2])
        raise RuntimeError(f"{name} failed:\n{r.stderr[-2000:]}")
    summary = json.loads((run / "summary.json").read_text())
    return summary["train_seconds"] / summary["steps"]


MIN_ROUNDS = 5


def order(round_index: int, names: list[str]) -> list[str]:
    """The engines in round ``round_index``'s order: the list rotated by the round's index."""
    k = round_index % len(names)
    return names[k:] + names[:k]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=MIN_ROUNDS)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--size", default="tiny")
    a = p.parse_args()
    if a.rounds < MIN_ROUNDS:
        p.error(
            f"--rounds {a.rounds}: fewer than {MIN_ROUNDS} rounds give no usable spread; use "
            f"--rounds {MIN_ROUNDS}"
        )
    times, missing = measure(a)
    print(
        f"\nmodel {a.size}, 2 ranks (gloo, CPU), global batch 16 x 64 tokens, {a.steps} steps, "
        f"{a.rounds} rounds "
        "interleaved (rotating order)"
    )
    print(f"{'engine':<18} {'median ms/step':>14} {'ratio to DDP (median, min-max over rounds)':>44}")
    for name, values in times.items():
        ratios = [t / d for t, d in zip(values, times["DDP"])]
        print(
            f"{name:<18} {statistics.median(values) * 1e3:14.1f} {statistics.median(ratios):13.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f})"
        )
    for name, why in missing.items():
        print(f"{name:<18} not measured: {why}")
    return 0


def measure(a) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Step times per engine, one per round (rotating order); engines whose library is missing, and why."""
    names = list(ENGINES)
    times: dict[str, list[float]] = {n: [] for n in names}
    missing: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for name in order(r, [n for n in names if n not in missing]):
                try:
                    times[name].append(step_time(Path(tmp) / f"r{r}", name, ENGINES[name], a))
                except LookupError as e:
                    missing[name] = str(e)
                    continue
                print(f"round {r + 1}: {name:<18} {times[name][-1] * 1e3:8.1f} ms/step", flush=True)
    return {n: v for n, v in times.items() if n not in missing}, missing


if __name__ == "__main__":
    raise SystemExit(main())
