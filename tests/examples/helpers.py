"""Run the examples as a user does: `python SCRIPT ARGS` (one process) or `exatrain run --nproc 2 SCRIPT
ARGS` (two local ranks: real gloo process groups under torchrun's agent), and make their tiny data."""

import importlib.util
import subprocess
import sys
from pathlib import Path

from exatrain.observe import read_metrics
from tests.conftest import clean_environment

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_module(path: Path, name: str):
    """Import a file of examples/ as a module (the examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_data = load_module(EXAMPLES / "make_data.py", "examples_make_data")


def run_example(script: str, args: list[str], nproc: int, cwd: Path, timeout: float = 600) -> str:
    """Run examples/SCRIPT to the end on `nproc` processes; its stdout (fails with the output otherwise).

    One thread per process (as torchrun gives each worker), no hub access (HF_HUB_OFFLINE=1)."""
    path = str(EXAMPLES / script)
    launch = (
        [sys.executable, path]
        if nproc == 1
        else [sys.executable, "-m", "exatrain.cli.main", "run", "--nproc", str(nproc), path]
    )
    env = clean_environment({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    proc = subprocess.run(
        [*launch, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, (
        f"{script} on {nproc} process(es) exited with {proc.returncode}\n"
        f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )
    return proc.stdout


def step_losses(run_dir: Path) -> dict[int, float]:
    """{step: loss averaged across ranks} from a run's metrics.jsonl."""
    return {r["step"]: r["loss"] for r in read_metrics(Path(run_dir) / "metrics.jsonl")}


def max_relative_difference(a: dict[int, float], b: dict[int, float]) -> float:
    """The largest |a - b| / |b| over the steps both have (which must be the same steps)."""
    assert a.keys() == b.keys(), f"steps differ: {sorted(a)} vs {sorted(b)}"
    return max(abs(a[s] - b[s]) / abs(b[s]) for s in a)
