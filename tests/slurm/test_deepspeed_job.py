"""A DeepSpeed ZeRO-2 job from `exatrain submit` (the generated script, unedited) on 2 nodes x 1 task of the
real SLURM testbed, in srun and torchrun launch mode: no pdsh/ssh, exatrain's process group handed to
DeepSpeed, DeepSpeed's CPU accelerator (the testbed's GPUs are gres entries without devices, so each rank
picks DS_ACCELERATOR=cpu itself, as on any CPU node).

Reference: the same config trained by `exatrain train --nproc 2` on this machine. Same world size, so the same
shards and sums: every step's loss within 1e-5 (the engines' tolerance; in practice equal).
"""

import json

import pytest

from tests.conftest import run_exatrain
from tests.distributed.helpers import train_losses
from tests.slurm.test_submit import PROFILE, _submit

pytestmark = pytest.mark.slurm

JOB = """[job]
nodes = 2
gpus_per_node = 1
time = 10
profile = "{profile}"
launch = "{launch}"
[job.env]
OMP_NUM_THREADS = "1"
"""
TRAINING = """[engine]
name = "deepspeed"
zero_stage = 2
[checkpoint]
interval = 6
[train]
steps = 6
log_every = 1
eval_every = 0
eval_batches = 2
eval_at_start = false
global_batch_size = 8
micro_batch_size = 2
grad_clip = 0.5
save_model = false
[data]
seq_len = 16
"""
STEPS, TOL = 6, 1e-5


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory):
    """{step: loss} of the same config trained locally by 2 gloo workers."""
    tmp = tmp_path_factory.mktemp("ds-local")
    config = tmp / "job.toml"
    config.write_text(TRAINING)
    r = run_exatrain(["train", "--nproc=2", f"--config={config}", f"--run.dir={tmp / 'run'}"], cwd=tmp)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return train_losses(tmp / "run")


@pytest.mark.parametrize("launch", ["srun", "torchrun"])
def test_deepspeed_job_on_two_nodes(slurm_cluster, tmp_path, local_reference, launch, monkeypatch):
    # sbatch exports the submitting environment: an earlier in-process DeepSpeed test may have set this here
    monkeypatch.delitem(slurm_cluster.env, "DS_ACCELERATOR", raising=False)
    profile = tmp_path / "testbed.toml"
    profile.write_text(PROFILE.format(visibility="gpus-per-node"))
    config = tmp_path / "job.toml"
    config.write_text(JOB.format(profile=profile, launch=launch) + TRAINING)
    run = tmp_path / "runs" / launch
    job, state, _, log = _submit(slurm_cluster, tmp_path, str(config), f"--run.dir={run}")
    assert state == "COMPLETED", log
    assert "layout DeepSpeed ZeRO-2 over 2 rank(s) (DeepSpeed accelerator cpu)" in log, log

    ranks = [json.loads((run / "ranks" / f"rank-{r}.json").read_text()) for r in range(2)]
    assert [(r["global_rank"], r["hostname"], r["world_size"]) for r in ranks] == [
        (0, "node1", 2),
        (1, "node2", 2),
    ]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == STEPS

    ckpt = run / "checkpoints" / f"step-{STEPS}"
    assert (ckpt / "COMMITTED").is_file()
    assert json.loads((ckpt / "exatrain.json").read_text()) == {
        "step": STEPS,
        "world_size": 2,
        "zero_stage": 2,
    }
    shards = sorted(p.name for p in (ckpt / "deepspeed").glob("*optim_states.pt"))
    assert len(shards) == 2, shards  # one ZeRO partition from each node's rank

    got = train_losses(run)  # also checks: every step recorded once, in order
    assert sorted(got) == list(range(1, STEPS + 1))
    assert max(abs(got[s] - local_reference[s]) for s in got) <= TOL, (got, local_reference)
