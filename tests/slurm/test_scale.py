"""`exatrain scale job.toml --nodes 1,2` on the real SLURM test cluster: one `exatrain submit` job per node
count, one after the other, then the report of both runs (strong scaling: the same global batch)."""

import json
import os
import sys
from datetime import datetime
from pathlib import Path

import pytest

from tests.slurm.test_submit import ROOT, _job_toml

pytestmark = pytest.mark.slurm


def test_scale_over_nodes(slurm_cluster, tmp_path):
    config = _job_toml(tmp_path)  # 2 ranks per node (one per fake GPU), 8 steps, global batch 8
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    r = slurm_cluster.run(
        [
            sys.executable,
            "-m",
            "exatrain.cli.main",
            "scale",
            str(config),
            "--nodes=1,2",
            f"--out={tmp_path / 'study'}",
        ],
        cwd=tmp_path,
        env=env,
        timeout=1200,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:] + slurm_cluster.log_tail()
    s = {n: json.loads((tmp_path / "study" / f"nodes-{n}" / "summary.json").read_text()) for n in (1, 2)}
    assert (s[1]["world_size"], s[2]["world_size"]) == (2, 4)
    assert all(x["steps"] == 8 and x["weights_in_sync"] for x in s.values())
    speedup = s[2]["tokens_per_s"] / s[1]["tokens_per_s"]
    md = (tmp_path / "study" / "report.md").read_text()
    assert f"| nodes-2 | 4 | {s[2]['tokens_per_s']:,.0f} | {speedup:.2f} | {speedup / 2:.0%} |" in md
    assert (tmp_path / "study" / "report.html").read_text().count("<img ") == 4
    assert r.stdout.count("scale: ") == 2 and "job " in r.stdout
    _one_after_another_never_sharing_nodes(slurm_cluster, r.stdout)


def _one_after_another_never_sharing_nodes(cluster, stdout: str) -> None:
    """docs/observability.md: "each job starts after the previous one ended, so they never share nodes". From
    SLURM's own job records (`scontrol show job`, which needs no accounting): the 1-node job's node is one of
    the 2-node job's, and the 2-node job started at or after the second the 1-node job ended (SLURM's times
    have a resolution of one second)."""
    ids = [line.split(": job ")[1].split()[0] for line in stdout.splitlines() if line.startswith("scale: ")]
    jobs = [cluster.job_info(job)[0] for job in ids]
    assert [j["JobState"] for j in jobs] == ["COMPLETED", "COMPLETED"], jobs
    assert [j["NumNodes"] for j in jobs] == ["1", "2"], jobs
    nodes = [set(_expand(cluster, j["NodeList"])) for j in jobs]
    assert nodes[0] < nodes[1], nodes  # they would share a node had they overlapped in time
    first_end = datetime.fromisoformat(jobs[0]["EndTime"])
    second_start = datetime.fromisoformat(jobs[1]["StartTime"])
    assert second_start >= first_end, (jobs[0]["EndTime"], jobs[1]["StartTime"])
    assert datetime.fromisoformat(jobs[0]["StartTime"]) <= first_end


def _expand(cluster, nodelist: str) -> list[str]:
    """node[1-2] -> node1, node2, by SLURM itself."""
    return cluster.run(["scontrol", "show", "hostnames", nodelist], check=True).stdout.split()
