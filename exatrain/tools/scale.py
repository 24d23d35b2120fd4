"""`exatrain scale --nproc 1,2,4`: the same short training run at several local world sizes (a scaling study),
each in its own run directory, then the report of all of them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from exatrain.errors import ExatrainError


def parse_counts(text: str, flag: str = "--nproc") -> list[int]:
    """'1,2,4' -> [1, 2, 4] (positive, distinct); errors name `flag`."""
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise ExatrainError(
            f"{flag} {text!r}: expected distinct positive numbers like 1,2,4",
            f"e.g. exatrain scale {flag} 1,2,4",
        )
    return sorted(counts)


def _run_env() -> dict[str, str]:
    """The runs' environment: one CPU thread per rank unless OMP_NUM_THREADS says otherwise, at every size
    (torchrun sets it for its workers, a single process would use every core: not like for like)."""
    return {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


def run_study(
    counts: list[int], out: Path, mode: str, global_batch: int, config: str | None, overrides: list[str]
) -> list[Path]:
    """Train once per count into OUT/nproc-N. strong: the same global batch everywhere; weak: the same batch
    per rank (global batch x N / the smallest N). Returns the run directories."""
    runs = []
    for n in counts:
        batch = global_batch if mode == "strong" else global_batch * n // counts[0]
        run = out / f"nproc-{n}"
        # the study's batch goes last: a --train.global_batch_size among the overrides is the base it scales
        cmd = [
            sys.executable,
            "-m",
            "exatrain.cli.main",
            "train",
            f"--nproc={n}",
            f"--run.dir={run}",
            *(["--config", config] if config else []),
            *overrides,
            f"--train.global_batch_size={batch}",
        ]
        print(f"scale: {n} rank(s), global batch {batch} -> {run}", flush=True)
        done = subprocess.run(cmd, env=_run_env())
        if done.returncode != 0:
            raise ExatrainError(
                f"the run with {n} rank(s) failed (exit code {done.returncode})",
                f"see its output above; rerun it alone with: {' '.join(cmd[2:])}",
            )
        runs.append(run)
    return runs


def run_slurm_study(
    counts: list[int],
    out: Path,
    mode: str,
    global_batch: int,
    config: str | None,
    overrides: list[str],
    runner,
    poll_s: float = 5.0,
) -> list[Path]:
    """Submit one job per node count (OUT/nodes-N) with `exatrain submit`'s script, one after the other
    (each waits for the previous to end, so they never share the machine). Returns the run directories."""
    from exatrain.config import load_config
    from exatrain.slurm.submit import prepare, submit

    runs = []
    for n in counts:
        batch = global_batch if mode == "strong" else global_batch * n // counts[0]
        run = out / f"nodes-{n}"
        cfg = load_config(
            config,
            [
                *overrides,
                f"--job.nodes={n}",
                f"--run.dir={run.resolve()}",
                f"--train.global_batch_size={batch}",
            ],
        )
        job = prepare(cfg, None)
        job_id = submit(job, runner)
        print(f"scale: {n} node(s), global batch {batch}: job {job_id} -> {run}", flush=True)
        _wait_gone(runner, job_id, poll_s)
        if not (run / "summary.json").exists():
            raise ExatrainError(
                f"job {job_id} ({n} node(s)) ended without finishing its run",
                f"see its output: {job.output_paths(job_id)[0]}",
            )
        runs.append(run)
    return runs


def _wait_gone(runner, job_id: str, poll_s: float) -> None:
    """Wait until SLURM no longer lists the job (it ended, whatever its state)."""
    import time

    while True:
        r = runner(["squeue", "-h", "-j", job_id, "-o", "%T"])
        if r.returncode != 0 or not r.stdout.strip():
            return
        time.sleep(poll_s)
