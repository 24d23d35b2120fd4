"""Other frameworks' scripts on 2 nodes of the real SLURM test cluster (1 rank per node, CPU, gloo), checked
as tests/e2e/test_peers.py checks them locally: Accelerate's own bundled test script, a Lightning Trainer fit
and a Fabric loop.

- srun mode: one hand-written batch job (`sbatch -N 2 -n 2`, the steps in the README's form `srun
  --ntasks-per-node=1 exatrain run SCRIPT`); Lightning picks its SLURMEnvironment there. One more step uses
  the form Lightning refuses (`srun -n 2` without --ntasks-per-node): exatrain warns, then Lightning's own
  check stops the step, so the warning is tested against Lightning's real rule.
- torchrun mode: `exatrain submit` with launch = "torchrun" (the generated script, unedited), one job per
  script; Lightning picks its TorchElasticEnvironment there.
All jobs are submitted at once and run one after another."""

import json
import sys
from pathlib import Path

import pytest

from tests.e2e.test_peers import PEERS, accelerate_test_script, check_accelerate_output, check_lightning_ranks
from tests.slurm.test_submit import PROFILE, ROOT, _exatrain

pytestmark = pytest.mark.slurm

SRUN_JOB = """#!/bin/bash
#SBATCH --job-name=peers
#SBATCH --nodes=2
#SBATCH --ntasks=2
#SBATCH --time=00:10:00
#SBATCH --output=%x-%j.out
set -uo pipefail
export OMP_NUM_THREADS=1 PYTHONPATH={root}
run="srun --ntasks-per-node=1 --kill-on-bad-exit=1 {python} -m exatrain.cli.main run"
ACCELERATE_USE_CPU=1 $run {accelerate} > accelerate.out 2>&1; echo "accelerate exit $?"
$run {peers}/lightning_fit.py --devices 1 --nodes 2 --out trainer > trainer.out 2>&1; echo "trainer exit $?"
$run {peers}/fabric_loop.py --devices 1 --nodes 2 --out fabric > fabric.out 2>&1; echo "fabric exit $?"
srun -n 2 {python} -m exatrain.cli.main run {peers}/lightning_fit.py --devices 1 --nodes 2 --out refused \\
  > refused.out 2>&1; echo "refused exit $?"
"""
TORCHRUN_JOB = """[job]
nodes = 2
gpus_per_node = 1
time = 10
profile = "{profile}"
launch = "torchrun"
command = {command}
[job.env]
OMP_NUM_THREADS = "1"
ACCELERATE_USE_CPU = "1"
"""
SCRIPTS = ("accelerate", "trainer", "fabric")


def _command(name: str, out: Path) -> list[str]:
    if name == "accelerate":
        return ["python", accelerate_test_script()]
    script = "lightning_fit.py" if name == "trainer" else "fabric_loop.py"
    return ["python", str(PEERS / script), "--devices", "1", "--nodes", "2", "--out", str(out)]


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory):
    """Submit the srun-mode job and the three torchrun-mode jobs, wait for all: {mode: (folder, state,
    log)}."""
    tmp = tmp_path_factory.mktemp("peers")
    srun_dir = tmp / "srun"
    srun_dir.mkdir()
    script = srun_dir / "job.sbatch"
    script.write_text(
        SRUN_JOB.format(root=ROOT, python=sys.executable, accelerate=accelerate_test_script(), peers=PEERS)
    )
    submitted = {"srun": (srun_dir, slurm_cluster.sbatch(script, cwd=srun_dir), srun_dir / "peers-{job}.out")}
    profile = tmp / "testbed.toml"
    profile.write_text(PROFILE.format(visibility="gpus-per-node"))
    for name in SCRIPTS:
        folder = tmp / f"torchrun-{name}"
        folder.mkdir()
        config = folder / "job.toml"
        command = json.dumps(_command(name, folder / name))
        config.write_text(TORCHRUN_JOB.format(profile=profile, command=command))
        r = _exatrain(slurm_cluster, "submit", "-c", str(config), f"--run.dir={folder / 'run'}", cwd=folder)
        assert r.returncode == 0, r.stdout + r.stderr
        job = r.stdout.split("submitted job ")[1].split()[0]
        out = next(line.split("stdout  ", 1)[1] for line in r.stdout.splitlines() if "stdout  " in line)
        submitted[f"torchrun-{name}"] = (folder, job, Path(out))
    results = {}
    for mode, (folder, job, out) in submitted.items():
        state = slurm_cluster.wait(job, timeout=800)
        log_path = Path(str(out).format(job=job))
        results[mode] = (folder, state, log_path.read_text() if log_path.is_file() else f"(no {log_path})")
    return results


def _step_output(folder: Path, name: str) -> str:
    path = folder / f"{name}.out"
    return path.read_text() if path.is_file() else f"(no {path})"


@pytest.mark.parametrize("name", SCRIPTS)
def test_srun_mode(jobs, name):
    folder, state, log = jobs["srun"]
    output = _step_output(folder, name)
    assert state == "COMPLETED", log
    assert f"{name} exit 0" in log, log + output
    if name == "accelerate":
        check_accelerate_output(output, 2)
    else:
        ranks = check_lightning_ranks(folder / name, 2, "SLURMEnvironment", nodes=2)
        assert [x["host"] for x in ranks] == ["node1", "node2"]
        assert "WARNING" not in output, output


def test_srun_form_lightning_refuses_is_warned_about_first(jobs):
    folder, state, log = jobs["srun"]
    output = _step_output(folder, "refused")
    assert "refused exit 0" not in log, log + output
    assert "WARNING: this srun step has 2 tasks but SLURM_NTASKS_PER_NODE is unset" in output, output
    assert "HINT: start the step with --ntasks-per-node" in output
    # Lightning's own check then stopped it, as exatrain said
    assert "but this variable is not supported. HINT: Use `--ntasks-per-node=2` instead." in output, output
    assert output.index("WARNING: this srun step") < output.index("but this variable is not supported")


@pytest.mark.parametrize("name", SCRIPTS)
def test_torchrun_mode(jobs, name):
    folder, state, log = jobs[f"torchrun-{name}"]
    assert state == "COMPLETED", log
    if name == "accelerate":
        check_accelerate_output(log, 2)
    else:
        ranks = check_lightning_ranks(folder / name, 2, "TorchElasticEnvironment", nodes=2)
        assert [x["host"].split(".")[0] for x in ranks] == ["node1", "node2"]
    assert "Traceback" not in log, log
