"""Scripts that start their own processes (`torch.multiprocessing.spawn`, PyTorch's DDP tutorial's shape, with
the port set by the script): `exatrain run` runs them once, with torchrun's agent keeping its store to itself,
and they form their group; `--nproc 2` is refused within seconds with a HINT; under a torchrun agent that
shares its store (torchrun's default), the script runner refuses them instead of letting their processes
wait in that store (without the refusal this hangs until the join timeout: torch 2.13, checked by hand)."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, clean_environment, run_exatrain
from tests.distributed.helpers import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

SCRIPT = ROOT / "tests" / "peer_scripts" / "spawn_tutorial.py"


def test_self_spawning_script_runs_once_and_forms_its_group(tmp_path):
    out = tmp_path / "ranks"
    r = run_exatrain(["run", str(SCRIPT), str(free_port()), str(out)], cwd=tmp_path, timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "starts its own worker processes (torch.multiprocessing, line" in r.stderr
    assert "running it once (--nproc 1)" in r.stderr
    ranks = [json.loads((out / f"rank-{i}.json").read_text()) for i in range(2)]
    assert [(x["rank"], x["world_size"], x["sum_of_rank_plus_one"]) for x in ranks] == [
        (0, 2, 3.0),
        (1, 2, 3.0),
    ]
    assert sorted(p.name for p in out.iterdir()) == ["rank-0.json", "rank-1.json"]  # one world only


def test_self_spawning_script_with_nproc_2_is_refused_at_once(tmp_path):
    r = run_exatrain(
        ["run", "--nproc", "2", str(SCRIPT), "1", str(tmp_path / "ranks")], cwd=tmp_path, timeout=30
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--nproc 2 would start 2 copies of it" in r.stderr
    assert f"HINT: run it once: `exatrain run --nproc 1 {SCRIPT}`" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "ranks").exists()


def test_self_spawning_script_under_torchrun_sharing_its_store_is_refused(tmp_path):
    """Plain torchrun (shared store, its default) starting the script through exatrain's script runner, as the
    torchrun mode of `exatrain submit` does."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=1",
        "-m",
        "exatrain.launch.script_runner",
        str(SCRIPT),
        str(free_port()),
        str(tmp_path / "ranks"),
    ]
    r = subprocess.run(
        cmd,
        cwd=tmp_path,
        env=clean_environment({"OMP_NUM_THREADS": "1"}),
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert r.returncode != 0, r.stdout + r.stderr
    assert "inside a torchrun worker whose agent shares its TCP store" in r.stderr, r.stderr
    assert "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 first" in r.stderr
    assert not (tmp_path / "ranks").exists()  # refused before the script ran
