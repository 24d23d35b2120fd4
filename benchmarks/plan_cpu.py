"""Does `exatrain plan --time` predict a CPU gloo run on this machine? (issue 26: goal within 30 %)

For each world size W: `exatrain doctor --nproc W --device cpu` measures this machine's constants (matmul
TF/s of the model's own products and attention TF/s at its shape, memory bandwidth of each rank while all
W run, the gloo all-reduce busbw of its sweep's largest message) and prints the [hardware] lines; they go
into a copy of the cpu profile (gpus_per_node = 0: every rank on this one node, communication not
overlapping the compute; the CPU's decomposed RMSNorm kernels); `exatrain plan --time --world-size W
--site COPY` predicts the step; `exatrain train --nproc W` measures it: the median of the logged windows'
`step_s` after the first window (warm-up). Nothing is fitted: the prediction only sees the doctor's
constants and the model's shape.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/plan_cpu.py [--worlds 1,2,4] [--steps 40] [--repeats 3]
                                                              [--dropout 0.1]

--dropout trains the model with that dropout (the doctor then times the attention with it, the plan counts
the dropout kernels).

Prints one line per world size: the constants, predicted and measured step time and the error
(predicted / measured - 1), then the raw JSON of each step.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXATRAIN = [sys.executable, "-m", "exatrain.cli.main"]
# the reference model as the docs' CPU examples run it, small enough for 4 ranks on 2 cores
MODEL = ["--model.size=tiny", "--data.seq_len=128", "--train.global_batch_size=16", "--train.precision=fp32"]


def _run(args: list[str], cwd: Path) -> str:
    done = subprocess.run([*EXATRAIN, *args], cwd=cwd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        sys.exit(f"exatrain {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def hardware_lines(world: int, micro: int, cwd: Path) -> str:
    """The [hardware] table `exatrain doctor` prints for `world` local CPU ranks."""
    # the model's options: the matmul and attention probes time the job's own products and attention
    job = [*MODEL, f"--train.micro_batch_size={micro}"]
    out = _run(["doctor", f"--nproc={world}", "--device=cpu", "--iters=5", *job], cwd)
    # every `key = value  # comment` line of the table (a number, or a string such as source = "measured";
    # a line's comment says how it was measured)
    match = re.search(r"^\[hardware\]\n(?:[a-z_]+ = (?:[\d.e+-]+|\"[^\"]*\")[^\n]*\n?)+", out, re.M)
    if match is None:
        sys.exit(f"no [hardware] table in the doctor's output:\n{out[-3000:]}")
    return match.group(0)


def profile(world: int, hardware: str, where: Path) -> Path:
    """The cpu profile (gpus_per_node = 0: the plan puts every rank on one node) with the measured [hardware]
    table; its inter-node busbw (a one-node doctor run cannot measure it; --time requires the key) is the
    intra-node one and is never used here."""
    text = (ROOT / "exatrain/slurm/profiles/cpu.toml").read_text()
    intra = re.search(r"^intra_node_busbw_gbs = (\S+)", hardware, re.M)
    if intra is None:  # one rank: no all-reduce measured, none predicted (the keys are still required)
        extra = "intra_node_busbw_gbs = 1.0\ninter_node_busbw_gbs = 1.0\n"
    else:
        extra = "" if "inter_node" in hardware else f"inter_node_busbw_gbs = {intra.group(1)}\n"
    path = where / f"cpu-{world}.toml"
    path.write_text(text + "\n" + hardware.rstrip("\n") + "\n" + extra)
    return path


def predicted(world: int, site: Path, micro: int, cwd: Path) -> dict:
    out = _run(
        [
            "plan",
            f"--world-size={world}",
            f"--site={site}",
            "--time",
            "--json",
            *MODEL,
            f"--train.micro_batch_size={micro}",
        ],
        cwd,
    )
    return json.loads(out)


def measured(world: int, steps: int, micro: int, cwd: Path) -> list[float]:
    """Every logged window's mean step time of a real run (the first window is warm-up)."""
    run = cwd / f"run-{world}"
    _run(
        [
            "train",
            f"--nproc={world}",
            f"--run.dir={run}",
            f"--train.steps={steps}",
            "--train.log_every=5",
            "--train.eval_every=0",
            "--train.eval_at_start=false",
            "--train.eval_batches=1",
            "--train.device=cpu",
            "--run.hang_timeout_s=0",
            "--checkpoint.interval=0",
            *MODEL,
            f"--train.micro_batch_size={micro}",
        ],
        cwd,
    )
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r["step_s"] for r in map(json.loads, lines) if r.get("kind") == "train" and "step_s" in r]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="1,2,4")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="doctor, plan and training this many times per world size, one after the other (a shared "
        "machine's speed drifts between them; the last line per W compares the medians)",
    )
    ap.add_argument("--dropout", type=float, default=0.0, help="the model's dropout (model.dropout)")
    args = ap.parse_args()
    if args.dropout:
        MODEL.append(f"--model.dropout={args.dropout}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        for world in map(int, args.worlds.split(",")):
            micro = 16 // world  # no gradient accumulation: one micro batch per rank per step
            pairs = []
            for _ in range(args.repeats):
                hardware = hardware_lines(world, micro, where)
                plan = predicted(world, profile(world, hardware, where), micro, where)
                windows = measured(world, args.steps, micro, where)
                step = statistics.median(windows[1:])
                rows.append((world, hardware, plan, windows, step))
                pairs.append((plan["step_time_s"], step))
                error = plan["step_time_s"] / step - 1
                print(
                    f"W={world}: predicted {plan['step_time_s'] * 1e3:.1f} ms, measured {step * 1e3:.1f} ms "
                    f"(median of {len(windows) - 1} windows), error {error:+.0%}; "
                    + "; ".join(hardware.splitlines()[1:]),
                    flush=True,
                )
            if args.repeats > 1:
                p = statistics.median(x for x, _ in pairs)
                m = statistics.median(y for _, y in pairs)
                print(
                    f"W={world}: median of {args.repeats} predictions {p * 1e3:.1f} ms, of {args.repeats} "
                    f"measurements {m * 1e3:.1f} ms, error {p / m - 1:+.0%}",
                    flush=True,
                )
    for world, _hardware, plan, windows, _step in rows:
        print(
            json.dumps(
                {
                    "world": world,
                    "predicted": {k: plan[k] for k in ("step_time_s", "breakdown", "comm_s")},
                    "windows_step_s": windows,
                }
            )
        )


if __name__ == "__main__":
    main()
