"""Start-up time of the torch-free CLI paths against `python -c pass`, measured in the same run.

`exatrain --help`, `exatrain sbatch -c job.toml` and `exatrain cost -c job.toml` must stay well under 0.3 s on
a login node: `env/` and `launch/` never import torch. Each command runs `--reps` times, interleaved with
the baseline (base, A, B, C, base, A, ...) so machine noise hits all alike; reported are median wall
times, the time over the bare interpreter, and the ratio to it. Fails (exit 1) when a path imports
torch or a median exceeds --limit-ms.

Bytecode is cached (in a temporary PYTHONPYCACHEPREFIX, so nothing is written to the repository) as it
is for an installed package; with PYTHONDONTWRITEBYTECODE=1 every start would compile the sources again.

    .venv/bin/python benchmarks/cli_startup.py [--reps 15] [--limit-ms 300]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = '[job]\nnodes = 4\nprofile = "lumi-g"\npartition = "small-g"\ntime = "02:00:00"\n'
TORCH_PROBE = (
    "import runpy, sys; sys.argv = ['exatrain', *sys.argv[1:]]\n"
    "try:\n    runpy.run_module('exatrain.cli.main', run_name='__main__')\n"
    "except SystemExit:\n    pass\n"
    "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)"
)


def commands(job: str) -> dict[str, list[str]]:
    """The measured command lines (the interpreter baseline first)."""
    cli = [sys.executable, "-m", "exatrain.cli.main"]
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "exatrain --help": [*cli, "--help"],
        "exatrain sbatch -c job.toml": [*cli, "sbatch", job],
        "exatrain cost -c job.toml": [*cli, "cost", job],
    }


def wall(cmd: list[str], env: dict[str, str]) -> float:
    """Seconds one run takes (output discarded; a failing command aborts the benchmark)."""
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t0


def imports_torch(args: list[str], env: dict[str, str]) -> bool:
    """Whether running the CLI with ``args`` loads torch."""
    probe = subprocess.run(
        [sys.executable, "-c", TORCH_PROBE, *args], capture_output=True, text=True, env=env
    )
    return "NO-TORCH" not in probe.stderr


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--limit-ms", type=float, default=300.0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        job = str(Path(tmp) / "job.toml")
        Path(job).write_text(JOB)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        cmds = commands(job)
        times: dict[str, list[float]] = {name: [] for name in cmds}
        for _name, cmd in cmds.items():
            wall(cmd, env)  # compile to the bytecode cache, warm the page cache
        for rep in range(args.reps):
            order = list(cmds) if rep % 2 == 0 else list(reversed(cmds))
            for name in order:
                times[name].append(wall(cmds[name], env))
        torch_paths = [
            name for name, cmd in cmds.items() if name != "python -c pass" and imports_torch(cmd[3:], env)
        ]
    base = statistics.median(times["python -c pass"])
    print(f"python {sys.version.split()[0]}, {args.reps} interleaved repetitions, medians")
    ok = not torch_paths
    for name, values in times.items():
        median = statistics.median(values)
        ok &= median * 1000 <= args.limit_ms
        print(
            f"  {name:26s} {median * 1000:7.1f} ms  (+{(median - base) * 1000:6.1f} ms over python, "
            f"ratio {median / base:5.2f})"
        )
    print(
        f"torch imported by: {', '.join(torch_paths) or 'none'}; limit {args.limit_ms:g} ms: "
        f"{'met' if ok else 'NOT met'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
