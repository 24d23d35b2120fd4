"""Example (d), an unmodified torchrun-style DDP script, submitted with `exatrain submit` on the real SLURM
testbed (2 nodes x 2 tasks; fake gres GPUs, so the ranks train on CPU with gloo) in both launch modes:
srun (the script is wrapped in `exatrain run`, which gives it torchrun's variables) and torchrun (torchrun
gives them). Every rank reports the variables it saw; the job trained (the loss fell, weights agree)."""

import json
from pathlib import Path

import pytest

from tests.slurm.test_submit import PROFILE, ROOT, _exatrain

pytestmark = pytest.mark.slurm

SCRIPT = ROOT / "examples" / "torchrun_ddp" / "train.py"
JOB = """[job]
nodes = 2
time = 10
profile = "{profile}"
launch = "{launch}"
command = ["python", "{script}", "--epochs", "2", "--out", "{out}"]
[job.env]
OMP_NUM_THREADS = "1"
"""


@pytest.mark.parametrize("launch", ["srun", "torchrun"])
def test_unmodified_script_sees_torchrun_variables(slurm_cluster, tmp_path, launch):
    profile = tmp_path / "testbed.toml"
    profile.write_text(PROFILE.format(visibility="gpus-per-task"))
    out = tmp_path / "ranks"
    config = tmp_path / "job.toml"
    config.write_text(JOB.format(profile=profile, launch=launch, script=SCRIPT, out=out))
    run_dir = tmp_path / "runs" / launch
    r = _exatrain(slurm_cluster, "submit", "-c", str(config), f"--run.dir={run_dir}", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    job = r.stdout.split("submitted job ")[1].split()[0]
    state = slurm_cluster.wait(job, timeout=420)
    log_path = Path(
        next(line.split("stdout  ", 1)[1] for line in r.stdout.splitlines() if "stdout  " in line)
    )
    log = log_path.read_text() if log_path.is_file() else f"(no {log_path})"
    assert state == "COMPLETED", log
    script = (run_dir.parent / f"{launch}.sbatch").read_text()
    assert ("exatrain.cli.main run --profile=" in script) == (launch == "srun"), script

    ranks = [json.loads((out / f"rank-{i}.json").read_text()) for i in range(4)]
    seen = [r["seen"] for r in ranks]
    assert [
        (s["RANK"], s["WORLD_SIZE"], s["LOCAL_RANK"], s["LOCAL_WORLD_SIZE"], s["GROUP_RANK"]) for s in seen
    ] == [
        ("0", "4", "0", "2", "0"),
        ("1", "4", "1", "2", "0"),
        ("2", "4", "0", "2", "1"),
        ("3", "4", "1", "2", "1"),
    ]
    assert [r["host"] for r in ranks] == ["node1", "node1", "node2", "node2"]
    assert [(r["rank"], r["world_size"]) for r in ranks] == [
        (i, 4) for i in range(4)
    ]  # the group they formed
    masters = {(s["MASTER_ADDR"], s["MASTER_PORT"]) for s in seen}
    assert len(masters) == 1, masters
    master = masters.pop()[0]
    if launch == "srun":
        assert master == "node1"  # the first host of the step's node list
    else:
        assert (
            master.split(".")[0] == "node1"
        )  # torchrun's agent on the first node (its name as it reports it)
    assert "Traceback" not in log and "WARNING" not in log, log
    assert ranks[0]["losses"][-1] < ranks[0]["losses"][0] and len(ranks[0]["losses"]) == 2
    assert len({r["checksum"] for r in ranks}) == 1  # DDP kept the weights equal on every rank
    assert {r["samples"] for r in ranks} == {64}  # DistributedSampler: 256 samples / 4 ranks
