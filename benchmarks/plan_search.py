"""How long does `exatrain plan --search` take for 16,384 ranks on this machine? (goal: <= 60 s)

Runs the real CLI (import, config, search, output) as a subprocess, interleaved with `exatrain plan --help`
(the CLI's start-up alone, the baseline), REPEATS times each, and prints every wall time, the medians and
the search's own count of layouts and its elapsed time. The model is 7B-like (32 blocks, width 4096, 32
heads, T = 4096, global batch 4096 sequences = 16M tokens) on LUMI-G's bundled profile and its published
[hardware] constants (the ranking needs them; the time to search does not depend on their values).

    .venv/bin/python benchmarks/plan_search.py [--world-size 16384] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = [
    "--model.n_layers=32",
    "--model.dim=4096",
    "--model.n_heads=32",
    "--data.seq_len=4096",
    "--train.global_batch_size=4096",
    "--vocab-size",
    "32000",
]


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, r.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world-size", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    exe = [sys.executable, "-m", "exatrain"]
    cmd = exe + ["plan", "--world-size", str(args.world_size), "--site", "lumi-g", "--search"]
    cmd += ["--json", "--top", "3"] + MODEL
    search_s, start_s = [], []
    for i in range(args.repeats):
        s, _ = timed(exe + ["plan", "--help"])
        t, out = timed(cmd)
        start_s.append(s)
        search_s.append(t)
        res = json.loads(out)
        print(
            f"repeat {i}: start-up {s:.2f} s, plan --search {t:.2f} s (search itself "
            f"{res['elapsed_s']:.2f} s, "
            f"{res['considered']} valid layouts, {res['dropped_for_memory']} dropped for memory)"
        )
    print(
        f"median: start-up {statistics.median(start_s):.2f} s, plan --search "
        f"{statistics.median(search_s):.2f} s"
    )
    best = res["layouts"][0]
    print(f"fastest: {best['overrides']}\n  {best['why']}")


if __name__ == "__main__":
    main()
