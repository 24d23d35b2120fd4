"""exatrain.distributed on real gloo process groups started without torchrun (the srun/mpirun path)."""

import json

import pytest
import torch
import torch.multiprocessing as mp

from exatrain.config import JobConfig
from exatrain.distributed import (
    all_gather_objects,
    init_distributed,
    mean_across_ranks,
    print0,
    save0,
    select_backend,
    select_device,
    sum_across_ranks,
    teardown,
)
from exatrain.distributed.affinity import check_affinity
from exatrain.env import detect_environment
from exatrain.errors import ExatrainError
from exatrain.slurm import load_profile

pytestmark = pytest.mark.dist


from tests.distributed.helpers import free_port as _free_port  # noqa: E402
from tests.distributed.helpers import mpi_env as _mpi_env  # noqa: E402


def _worker(rank, world, port, out):
    ctx = init_distributed(_mpi_env(rank, world, port), "cpu", timeout_s=60)
    result = {
        "backend": ctx.backend,
        # integers: gloo has no AVG for them; the helper must still give the exact mean
        "mean": mean_across_ranks({"a": rank + 1, "b": 10 * rank}),
        "sum": sum_across_ranks([1.0, rank]),
        "gathered": all_gather_objects({"rank": rank}),
    }
    print0(f"hello from rank {rank}")
    save0({"rank": torch.tensor(rank)}, f"{out}/saved.pt")
    teardown()
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(result, f)


def test_collectives_on_four_gloo_ranks(tmp_path, capfd):
    world = 4
    mp.spawn(_worker, args=(world, _free_port(), str(tmp_path)), nprocs=world, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for r in results:
        assert r["backend"] == "gloo"
        assert r["mean"] == {"a": 2.5, "b": 15.0}
        assert r["sum"] == [4.0, 6.0]
        assert r["gathered"] == [{"rank": i} for i in range(world)]
    assert torch.load(tmp_path / "saved.pt", weights_only=True)["rank"].item() == 0  # written by rank 0 only
    assert capfd.readouterr().out.count("hello from rank") == 1


def test_join_timeout_names_master_and_port():
    port = _free_port()
    with pytest.raises(ExatrainError) as e:  # rank 0 of 2, and rank 1 never comes
        init_distributed(_mpi_env(0, 2, port), "cpu", timeout_s=3)
    assert f"127.0.0.1:{port}" in str(e.value) and "HINT:" in str(e.value)
    assert "1 of 2 ranks never checked in: 1" in str(e.value)


def _agent_env(rank: int, world: int, port: int):
    """A torchrun worker whose agent shares its store (TORCHELASTIC_USE_AGENT_STORE=True): every rank is a
    client."""
    return detect_environment(
        {
            "TORCHELASTIC_RUN_ID": "t",
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world),
            "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }
    )


def test_join_timeout_names_missing_ranks_on_every_rank():
    """Ranks 0 and 1 of 4 come, ranks 2 and 3 never do: every rank that came names the missing ones.

    The order is fixed by events, not by the clock: the test hosts the store as torchrun's agent does, rank 1
    checks in (with a generous timeout), and only once its check-in is in the store does rank 0 start, with a
    short timeout that must expire. The ranks are threads of this process (the roll call is store traffic
    only); the real multi-process join is covered by the other tests here."""
    import datetime
    import threading

    from exatrain.distributed.join import roll_call

    port = _free_port()
    agent = torch.distributed.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    errors = {}

    def rank(r, timeout_s):
        try:
            roll_call(_agent_env(r, 4, port), timeout_s)
        except ExatrainError as e:
            errors[r] = str(e)

    late = threading.Thread(target=rank, args=(1, 300))
    late.start()
    agent.wait(["exatrain/join/-/0/rank/1"], datetime.timedelta(seconds=300))
    rank(0, 1)
    late.join()
    assert sorted(errors) == [0, 1]
    for r, text in errors.items():
        assert f"rank {r}/4 could not join" in text and "2 of 4 ranks never checked in: 2-3" in text, text


def test_unreachable_master_is_named(capfd):
    """Nobody listens: rank 1 waits for the port itself and never starts torch's store client, which would
    try again after its own timeout and print a C++ traceback per try (torch 2.13)."""
    port = _free_port()
    with pytest.raises(
        ExatrainError,
        match=f"rank 1/2 could not reach the master at 127.0.0.1:{port} within 2 s \\(nothing accepted",
    ):
        init_distributed(_mpi_env(1, 2, port), "cpu", timeout_s=2)
    err = capfd.readouterr().err
    assert "TCPStore.cpp" not in err and "socket.cpp" not in err, err


def test_a_taken_port_is_named_by_rank_0_at_once():
    """Another process holds the port (in CI: an outgoing connection had taken a derived port): rank 0 says
    it cannot host the store there, with a hint to pick another port, instead of a join timeout."""
    import socket

    port = _free_port()
    with socket.socket() as other:
        other.bind(("", port))
        other.listen()
        with pytest.raises(ExatrainError) as e:
            init_distributed(_mpi_env(0, 2, port), "cpu", timeout_s=60)
    text = str(e.value)
    assert f"rank 0/2 could not host the rendezvous store at 127.0.0.1:{port}" in text, text
    assert "EADDRINUSE" in text and "HINT:" in text and "MASTER_PORT" in text, text


class _FakeCuda:
    """Stands in for torch.cuda: this machine has no GPU (mocked, as the test cannot run on real GPUs
    here)."""

    def __init__(self, count):
        self.count, self.selected = count, None

    def install(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(torch.cuda, "set_device", lambda i: setattr(self, "selected", i))


SRUN_TASK = {
    "SLURM_JOB_ID": "9",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_NODELIST": "g[1-2]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
}


@pytest.mark.parametrize("visible, expected", [(1, 0), (2, 1), (8, 1)])
def test_device_follows_visibility(monkeypatch, visible, expected):
    """One visible GPU (SLURM --gpus-per-task) -> device 0; all visible (--gpus-per-node) -> local rank.
    GPUs are mocked: none exist on this machine."""
    fake = _FakeCuda(visible)
    fake.install(monkeypatch)
    dev = select_device(detect_environment(SRUN_TASK), "auto")
    assert dev == torch.device("cuda", expected) and fake.selected == expected
    assert select_backend(dev) == "nccl"


def test_cpu_when_no_gpu_and_gloo():
    dev = select_device(detect_environment({}), "auto")
    assert dev.type == "cpu" and select_backend(dev) == "gloo"
    with pytest.raises(ExatrainError, match="HINT"):
        select_backend(dev, "nccl")


def test_cpu_run_affinity_note_names_no_gpu_profile(capfd):
    """A CPU run of the default job (one process, as `exatrain train --nproc 1` runs): the default profile
    (a GPU one) has no CPU masks and the rank uses no GPU, so it says that nothing is checked, without naming
    that GPU profile, which has nothing to do with a CPU run."""
    profile = JobConfig().profile
    assert load_profile(profile).gpus_per_node > 0  # the case that matters: a GPU profile by default
    ctx = init_distributed(detect_environment({}), "cpu", timeout_s=60)
    try:
        check_affinity(ctx, JobConfig(), "warn")
    finally:
        teardown()
    out = capfd.readouterr().out
    assert out.startswith("CPU affinity: unchecked (") and out.count("\n") == 1, out
    assert profile not in out, out


def _map_by_node_worker(rank, world, port, out):
    # as mpirun --map-by node sets it for one rank per node: local rank 0 of 1 on every "node"; the master is
    # named by host name, as on a real multi-node job
    import socket

    env = detect_environment(
        {
            "OMPI_COMM_WORLD_RANK": str(rank),
            "OMPI_COMM_WORLD_SIZE": str(world),
            "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
            "MASTER_ADDR": socket.gethostname(),
            "MASTER_PORT": str(port),
        }
    )
    before = (env.node_rank, env.num_nodes)
    ctx = init_distributed(env, "cpu", timeout_s=60)
    teardown()
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"before": before, "after": [ctx.env.node_rank, ctx.env.num_nodes]}, f)


def test_mpi_node_layout_comes_from_the_ranks_host_names(tmp_path):
    """Two real gloo ranks whose MPI variables cannot say where they run (local size 1 each): the node layout
    is unknown before the group exists and then learnt from the host names: both share this machine."""
    port = _free_port()
    mp.spawn(_map_by_node_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got == {"before": [None, None], "after": [0, 1]}, (rank, got)
