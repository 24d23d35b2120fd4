"""`srun exatrain train` on 2 nodes x 2 tasks of a real SLURM cluster started on this machine."""

import json
import sys

import pytest

from exatrain.observe import read_metrics

pytestmark = pytest.mark.slurm

JOB = """#!/bin/bash
#SBATCH --job-name=exatrain-ddp
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --time=00:10:00
#SBATCH --output=%x-%j.out
set -euo pipefail
export OMP_NUM_THREADS=1
# sbatch runs a copy of this script from the spool directory: paths come from the submit directory
srun --kill-on-bad-exit=1 {python} -m exatrain.cli.main train --run.dir="$SLURM_SUBMIT_DIR/run" \\
  --train.steps=40 --train.log_every=5 --train.eval_every=20 --train.eval_batches=4 \\
  --train.global_batch_size=16 --train.micro_batch_size=4 --data.seq_len=32
"""


def test_two_nodes_two_tasks_each(slurm_cluster, tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(JOB.format(python=sys.executable))
    job = slurm_cluster.sbatch(script, cwd=tmp_path)
    state = slurm_cluster.wait(job, timeout=600)
    log = next(tmp_path.glob(f"exatrain-ddp-{job}.out"), None)
    output = log.read_text() if log else "(no output file)"
    assert state == "COMPLETED", output

    ranks = [json.loads((tmp_path / "run" / "ranks" / f"rank-{r}.json").read_text()) for r in range(4)]
    placement = [(r["kind"], r["global_rank"], r["hostname"], r["local_rank"], r["node_rank"]) for r in ranks]
    assert placement == [
        ("slurm", 0, "node1", 0, 0),
        ("slurm", 1, "node1", 1, 0),
        ("slurm", 2, "node2", 0, 1),
        ("slurm", 3, "node2", 1, 1),
    ], output
    assert all(r["world_size"] == 4 and r["main_address"] == "node1" for r in ranks)
    assert len({r["weights_sha256"] for r in ranks}) == 1, "weights differ between ranks"

    train = [m["loss"] for m in read_metrics(tmp_path / "run" / "metrics.jsonl") if m["kind"] == "train"]
    assert train[-1] < train[0] - 0.5, f"loss did not fall: {train}"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["weights_in_sync"]
