"""Start N real gloo ranks in this machine's processes, the way srun/mpirun would (no torchrun)."""

import torch.multiprocessing as mp

from exatrain.env import detect_environment
from tests.ports import free_port


def mpi_env(rank: int, world: int, port: int):
    """What Open MPI's mpirun sets for one rank (plus the master address a job script exports)."""
    return detect_environment(
        {
            "OMPI_COMM_WORLD_RANK": str(rank),
            "OMPI_COMM_WORLD_SIZE": str(world),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
            "OMPI_COMM_WORLD_LOCAL_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )


def _entry(rank, fn, world, port, args):
    fn(rank, world, mpi_env(rank, world, port), *args)


def spawn(fn, world: int, *args) -> None:
    """Run `fn(rank, world, env, *args)` on `world` processes; `fn` must be a module-level function.

    Any rank's exception fails the call (torch.multiprocessing re-raises it with its traceback)."""
    mp.spawn(_entry, args=(fn, world, free_port(), args), nprocs=world, join=True)


def train_records(run_dir) -> list[dict]:
    """The train records of a run's metrics.jsonl in file order, checked: every step at most once and in
    increasing order (a duplicated, lost-and-rewritten or reordered record fails here, which a dict keyed
    by step would hide)."""
    from exatrain.observe import read_metrics

    records = [m for m in read_metrics(run_dir / "metrics.jsonl") if m["kind"] == "train"]
    steps = [m["step"] for m in records]
    assert steps == sorted(set(steps)), f"{run_dir}: train records duplicated or out of order: {steps}"
    return records


def train_losses(run_dir) -> dict[int, float]:
    """{step: training loss} of a run (records checked by train_records)."""
    return {m["step"]: m["loss"] for m in train_records(run_dir)}


def batch_digests(run_dir) -> dict[int, int]:
    """{step: digest of the global batch the trainer really consumed at that step} (see samples_digest)."""
    return {m["step"]: m["batch_digest"] for m in train_records(run_dir)}
