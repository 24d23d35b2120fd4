"""Step time of each engine relative to torch DDP, same model, same batches, 2 ranks, measured interleaved.

    .venv/bin/python benchmarks/engines.py [--rounds 2] [--steps 30] [--size tiny]

Each round runs every engine once through the real CLI (`exatrain train --nproc 2`), in order, so a load change
on the machine hits all engines alike; the step time of a run is its summary's train_seconds / steps (the
loop only: start-up, evaluation and model saving excluded). Prints the median step time per engine over the
rounds and its ratio to DDP's. Engines whose library is missing are reported as such, not silently left out.
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
    cmd = [sys.executable, "-m", "exatrain.cli.main", "train", "--nproc=2", f"--run.dir={run}", f"--model.size={a.size}",
           f"--train.steps={a.steps}", "--train.eval_every=0", "--train.eval_at_start=false", "--train.eval_batches=1",
           "--train.save_model=false", "--train.global_batch_size=16", "--train.micro_batch_size=8",
           f"--train.log_every={a.steps}", "--data.seq_len=64", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    if r.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{r.stderr[-2000:]}")
    summary = json.loads((run / "summary.json").read_text())
    return summary["train_seconds"] / summary["steps"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--size", default="tiny")
    a = p.parse_args()
    times: dict[str, list[float]] = {n: [] for n in ENGINES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for name, args in ENGINES.items():
                times[name].append(step_time(Path(tmp) / f"r{r}", name, args, a))
                print(f"round {r + 1}: {name:<18} {times[name][-1] * 1e3:8.1f} ms/step", flush=True)
    base = statistics.median(times["DDP"])
    print(f"\nmodel {a.size}, 2 ranks (gloo, CPU), global batch 16 x 64 tokens, {a.steps} steps, {a.rounds} rounds interleaved")
    print(f"{'engine':<18} {'median ms/step':>14} {'ratio to DDP':>13}")
    for name, values in times.items():
        m = statistics.median(values)
        print(f"{name:<18} {m * 1e3:14.1f} {m / base:13.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
