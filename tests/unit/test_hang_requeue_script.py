"""The batch script's hang tail (job.hang_requeues, docs/hangs.md), run by bash with a stand-in `scontrol`
that records its calls and answers `show job` with a given ExcNodeList; and which nodes the diagnosis blames.

The stand-in does not reproduce SLURM (tests/slurm/test_hang_requeue.py runs the tail in a real job); it
checks the script's own logic: the cap per job, the merge with excluded nodes the job already has, the
order requeuehold -> update -> release, and nothing at all without a hang or with hang_requeues = 0.
"""

import dataclasses
import os
import subprocess

import pytest

from exatrain.errors import ConfigError
from exatrain.observe.hang_report import suspect_nodes
from exatrain.slurm import JobSpec, load_profile, render_sbatch

FAKE_SCONTROL = """#!/bin/sh
echo "$*" >> "$CALLS"
[ "$1 $2" = "show job" ] && echo "JobId=$3 JobName=x ExcNodeList=$EXCLUDED Reason=None"
exit 0
"""


def _tail(requeues: int) -> str:
    """The script from the launch's `rc` on, with the launch line replaced by `rc=$RC`."""
    spec = dataclasses.replace(JobSpec(nodes=2, hang_requeues=requeues), profile="generic-nvidia")
    script = render_sbatch(spec, load_profile("generic-nvidia"), "RUNDIR")
    tail = script.split("\nrc=0\n", 1)[1]
    return "set -euo pipefail\nrc=$RC\n" + tail.split(" || rc=$?\n", 1)[1]


def _run(tmp_path, script: str, rc: int, exclude: str | None, excluded: str = "(null)"):
    bin_dir, run = tmp_path / "bin", tmp_path / "run"
    bin_dir.mkdir(exist_ok=True)
    (run / "hang").mkdir(parents=True, exist_ok=True)
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    calls = tmp_path / "calls"
    calls.write_text("")
    if exclude is not None:
        (run / "hang" / "exclude").write_text(exclude + "\n")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(calls),
        "EXCLUDED": excluded,
        "RUN_DIR": str(run),
        "SLURM_JOB_ID": "123",
        "RC": str(rc),
    }
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    return done, calls.read_text().splitlines()


def test_a_hang_requeues_the_job_held_excludes_the_node_and_releases_it(tmp_path):
    done, calls = _run(tmp_path, _tail(1), rc=76, exclude="gen2")
    assert done.returncode == 76, done.stderr
    assert calls == ["requeuehold 123", "show job 123", "update JobId=123 ExcNodeList=gen2", "release 123"]
    assert "exatrain: job 123 requeued after a hang (gen2 excluded)" in done.stderr
    assert not (tmp_path / "run" / "hang" / "exclude").exists()


def test_nodes_the_job_already_excludes_stay_excluded(tmp_path):
    _, calls = _run(tmp_path, _tail(2), rc=1, exclude="gen2", excluded="gen7")  # torchrun: the file says it
    assert "update JobId=123 ExcNodeList=gen7,gen2" in calls


def test_without_a_node_to_blame_the_job_is_requeued_as_it_was(tmp_path):
    done, calls = _run(tmp_path, _tail(1), rc=76, exclude="")
    assert calls == ["requeuehold 123", "release 123"] and "(no node excluded)" in done.stderr


def test_the_cap_counts_this_jobs_hang_requeues(tmp_path):
    (tmp_path / "run" / "hang").mkdir(parents=True)
    (tmp_path / "run" / "hang" / "requeues").write_text("99\n123\n")  # another job's, then this one's
    done, calls = _run(tmp_path, _tail(1), rc=76, exclude="gen2")
    assert calls == [] and "job.hang_requeues = 1 used up" in done.stderr
    _, calls = _run(tmp_path, _tail(2), rc=76, exclude="gen2")
    assert calls[0] == "requeuehold 123"
    assert (tmp_path / "run" / "hang" / "requeues").read_text().split() == ["99", "123", "123"]


@pytest.mark.parametrize("requeues, rc", [(1, 0), (1, 75), (0, 76)])
def test_no_hang_or_no_requeues_asked_for_means_no_hang_requeue(tmp_path, requeues, rc):
    script = _tail(requeues)
    assert ("hang/exclude" in script) == (requeues > 0)
    _, calls = _run(tmp_path, script, rc=rc, exclude=None)
    assert not [c for c in calls if "hold" in c or "ExcNodeList" in c]


def test_a_negative_count_is_refused_with_a_hint():
    with pytest.raises(ConfigError) as e:
        JobSpec(hang_requeues=-1)
    assert "job.hang_requeues" in str(e.value) and e.value.hint


def _rep(node: str, step: int = 7) -> dict:
    return {"host": node + ".site", "node": node, "pid": 1, "step": step, "phase": "step", "stalled_s": 25.0}


def test_the_blamed_ranks_nodes_are_the_suspects_unless_they_are_all_nodes():
    behind = {0: _rep("gen1", 8), 1: _rep("gen1", 8), 2: _rep("gen2")}  # rank 2 at the lowest step
    assert suspect_nodes(behind, {}) == ["gen2"]
    stopped = {3: {**_rep("gen3"), "silent_s": 30.0}}
    assert suspect_nodes({0: _rep("gen1"), 1: _rep("gen2")}, stopped) == ["gen3"]
    assert suspect_nodes({0: _rep("gen1", 8), 1: _rep("gen1")}, {}) == []  # one node: never all of them
    old = {r: {k: v for k, v in rep.items() if k != "node"} for r, rep in behind.items()}
    assert suspect_nodes(old, {}) == ["gen2.site"]  # a report without the node name: its host
