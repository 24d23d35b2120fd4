"""Other frameworks' scripts as tested clients of `exatrain run --nproc 2` (torchrun's agent, 2 local gloo
workers): Accelerate's own bundled test script (the one `accelerate test` runs, found through Accelerate's
own `path_in_accelerate_package`), a Lightning Trainer fit and a Fabric loop (tests/peer_scripts). Each
checks the ranks and world size the framework itself reports, a collective's result, and that every rank
got to its end (the run's exit code 0 needs every worker's 0). The same checks on the SLURM test cluster
(srun and torchrun mode): tests/slurm/test_peers.py."""

import json
import re

import pytest

from exatrain.env.devices import count_node_gpus
from tests.conftest import ROOT, run_exatrain

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PEERS = ROOT / "tests" / "peer_scripts"


def accelerate_test_script() -> str:
    """The script `accelerate test` runs (accelerate/commands/test.py names it the same way)."""
    from accelerate.test_utils import path_in_accelerate_package

    return str(path_in_accelerate_package("test_utils", "scripts", "test_script.py"))


def check_accelerate_output(text: str, world: int) -> None:
    """Accelerate's test script prints each rank's state, then runs its own checks of gather, broadcast,
    split, RNG synchronisation and DDP training parity (each an assertion that fails the rank)."""
    states = re.findall(
        r"Distributed environment: (\S+).*?\nNum processes: (\d+)\nProcess index: (\d+)", text
    )
    expected = [("DistributedType.MULTI_CPU", str(world), str(r)) for r in range(world)]
    assert sorted(states) == expected, text[-3000:]
    assert "All rng are properly synched." in text
    assert "Training yielded the same results on one CPU or distributed setup with batch split." in text


def check_lightning_ranks(out, world: int, environment: str, nodes: int = 1) -> list[dict]:
    """Every rank's report: rank and world size as Lightning saw them, its cluster environment, the
    all-reduce of rank+1 (world*(world+1)/2) and DDP's equal weights."""
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(world)]
    per_node = world // nodes
    assert [(x["rank"], x["world_size"], x["local_rank"], x["node_rank"]) for x in ranks] == [
        (r, world, r % per_node, r // per_node) for r in range(world)
    ]
    assert {x["environment"] for x in ranks} == {environment}
    assert {x["sum_of_rank_plus_one"] for x in ranks} == {world * (world + 1) / 2}
    assert len({tuple(x["weights"]) for x in ranks}) == 1
    assert sorted(p.name for p in out.iterdir()) == [f"rank-{r}.json" for r in range(world)]
    return ranks


def test_accelerate_test_script_in_two_workers(tmp_path):
    """On a node without GPUs Accelerate forms its group only with ACCELERATE_USE_CPU=1 (docs/peers.md)."""
    r = run_exatrain(
        ["run", "--nproc", "2", accelerate_test_script()],
        cwd=tmp_path,
        timeout=280,
        env={"ACCELERATE_USE_CPU": "1"},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    check_accelerate_output(r.stdout, 2)
    assert "ACCELERATE_USE_CPU is unset" not in r.stderr


@pytest.mark.skipif(bool(count_node_gpus()), reason="the warning is for nodes without GPUs")
def test_accelerate_script_without_cpu_flag_is_warned_about(tmp_path):
    """Without ACCELERATE_USE_CPU on a node without GPUs, Accelerate would run each rank alone: exatrain says
    so before starting the workers (a script that only imports accelerate, so the check costs no run)."""
    script = tmp_path / "uses_accelerate.py"
    script.write_text("import sys\nif len(sys.argv) > 5:\n    import accelerate\n")
    r = run_exatrain(["run", "--nproc", "1", str(script)], cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "WARNING: this node has no GPU and ACCELERATE_USE_CPU is unset" in r.stderr
    assert "HINT: export ACCELERATE_USE_CPU=1" in r.stderr


@pytest.mark.parametrize("script", ["lightning_fit.py", "fabric_loop.py"])
def test_lightning_in_two_workers(tmp_path, script):
    out = tmp_path / "ranks"
    r = run_exatrain(
        ["run", "--nproc", "2", str(PEERS / script), "--devices", "2", "--out", str(out)],
        cwd=tmp_path,
        timeout=280,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ranks = check_lightning_ranks(out, 2, "TorchElasticEnvironment")
    if script == "fabric_loop.py":
        assert {tuple(x["gathered"]) for x in ranks} == {(0, 1)}
    assert "Traceback" not in r.stderr
