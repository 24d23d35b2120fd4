"""Start a script as W real ranks the way mpirun/srun would (Open MPI variables, no torchrun) and read its
metrics: for tests of code written against exatrain's public API."""

import subprocess
import sys
from pathlib import Path

from exatrain.observe import read_metrics
from tests.conftest import clean_environment
from tests.distributed.helpers import free_port


def rank_environment(rank: int, world: int, port: int) -> dict:
    """What Open MPI's mpirun sets for one rank (plus the master address a job script exports)."""
    return clean_environment(
        {
            "OMPI_COMM_WORLD_RANK": str(rank),
            "OMPI_COMM_WORLD_SIZE": str(world),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
            "OMPI_COMM_WORLD_LOCAL_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
    )


def start_ranks(script: Path, args: list[str], world: int, log_dir: Path) -> list[subprocess.Popen]:
    """`python SCRIPT ARGS` as `world` ranks in the background; output in log_dir/rank-R.log."""
    port, procs = free_port(), []
    log_dir.mkdir(parents=True, exist_ok=True)
    for rank in range(world):
        with (log_dir / f"rank-{rank}.log").open("w") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(script), *args],
                    env=rank_environment(rank, world, port),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=log_dir,
                )
            )
    return procs


def run_ranks(script: Path, args: list[str], world: int, log_dir: Path, timeout: float = 600) -> None:
    """Run `python SCRIPT ARGS` as `world` ranks to the end; fail with the logs when a rank fails."""
    procs = start_ranks(script, args, world, log_dir)
    codes = [p.wait(timeout=timeout) for p in procs]
    logs = "\n".join((log_dir / f"rank-{r}.log").read_text()[-3000:] for r in range(world))
    assert codes == [0] * world, f"exit codes {codes}\n{logs}"


def losses(run_dir: Path) -> dict[int, float]:
    """{step: loss} of a run's metrics.jsonl."""
    return {m["step"]: m["loss"] for m in read_metrics(Path(run_dir) / "metrics.jsonl")}
