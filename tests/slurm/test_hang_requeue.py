"""Hang recovery of a SLURM job (issue 25, docs/hangs.md): a rank stalls, the watcher names it and its node,
every rank stops with exit code 76, the batch script requeues the job without that node (job.hang_requeues),
and the requeued job resumes from the last checkpoint and ends as an uninterrupted run would.

The job is `exatrain submit` of a user's own script (tests/distributed/hang_restart_loop.py, with its own
`exatrain.watch_hangs` and a 20 s timeout) on the generic site twin (gen1-3, each node in a network namespace
of its own, docs/sites/twins.md), 2 nodes, one rank per node, in srun and torchrun mode. Rank 1 (on the second
node) sleeps at step 7 of the first attempt; every step all-reduces its step number into a total kept in the
checkpoint (every 5 steps), so the last line's total equals 2 x (1 + ... + 12) only when the resumed run lost
no checkpointed state and repeated no step it had checkpointed. SLURM holds a requeued job a while before it
may start again; the test releases it at once (`StartTime=now`), as test_twin_training.py does.

Not reproduced: a really broken node (the stall is a sleep; the excluded node is healthy), GPUs and NCCL's
flight recorder (gloo's is used).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from exatrain.env.hostlist import expand_nodelist
from tests.distributed.test_hangs import RESTART_SCRIPT, _line_of
from tests.slurm.conftest import TERMINAL_STATES
from tests.slurm.test_submit import _exatrain

pytestmark = [pytest.mark.slurm]

STEPS = 12
NODES = ["gen1", "gen2", "gen3"]


def _job_file(where: Path, launch: str) -> Path:
    shutil.copy(RESTART_SCRIPT, where / RESTART_SCRIPT.name)
    run = where / "runs" / "t"
    text = f"""[job]
nodes = 2
gpus_per_node = 1
time = 10
partition = "generic"
profile = "generic-nvidia"
launch = "{launch}"
hang_requeues = 1
command = ["python", "{RESTART_SCRIPT.name}", "{run}", "{STEPS}", "20"]
[job.env]
OMP_NUM_THREADS = "1"
[run]
dir = "{run}"
"""
    (where / "job.toml").write_text(text)
    return where / "job.toml"


def _drive(cluster, jobs: dict, timeout: float = 600) -> None:
    """Poll until every job ended; a job found PENDING after it ran (requeued) is released at once."""
    deadline = time.monotonic() + timeout
    while any("state" not in j for j in jobs.values()):
        assert time.monotonic() < deadline, f"hang jobs still running after {timeout:.0f} s: {jobs}"
        for j in jobs.values():
            if "state" in j:
                continue
            info = cluster.job_info(j["job"])
            state = info[0].get("JobState", "UNKNOWN") if info else "UNKNOWN"
            j.setdefault("seen", []).append(state)
            if state == "PENDING" and "RUNNING" in j["seen"] and not j.get("released"):
                cluster.run(["scontrol", "update", f"jobid={j['job']}", "StartTime=now"], check=True)
                j["released"] = True
            elif state in TERMINAL_STATES:
                j.update(state=state, nodes=info[0].get("NodeList", "?"), excluded=info[0].get("ExcNodeList"))
        time.sleep(1)


@pytest.fixture(scope="module")
def hang_jobs(slurm_cluster, tmp_path_factory):
    """Both launch modes' jobs submitted at once (the second waits for nodes), followed to their end."""
    if not set(NODES) <= set(slurm_cluster.site_nodes):
        pytest.skip("the testbed was started without its site twins (STB_SITES=0)")
    jobs = {}
    for launch in ("srun", "torchrun"):
        where = tmp_path_factory.mktemp(f"hang-{launch}")
        r = _exatrain(slurm_cluster, "submit", "-c", str(_job_file(where, launch)), cwd=where)
        assert r.returncode == 0, r.stdout + r.stderr
        jobs[launch] = {"job": r.stdout.split("submitted job ")[1].split()[0], "where": where}
    _drive(slurm_cluster, jobs)
    for j in jobs.values():
        log = j["where"] / "runs" / f"exatrain-{j['job']}.out"
        j["log"] = log.read_text() if log.is_file() else f"(no {log})"
    return jobs


@pytest.mark.parametrize("launch", ["srun", "torchrun"])
def test_hung_job_is_requeued_without_the_stalled_rank_node_and_loses_nothing(hang_jobs, launch):
    j = hang_jobs[launch]
    log, run = j["log"], j["where"] / "runs" / "t"
    assert j["state"] == "COMPLETED", log[-6000:]
    diagnosis = (run / "hang" / "diagnosis.txt").read_text()
    stall = f"hang_restart_loop.py:{_line_of('STALL-LINE', RESTART_SCRIPT)} "
    assert "rank 1 (gen2," in diagnosis and stall in diagnosis, diagnosis
    assert "Suspect node(s): gen2 " in diagnosis, diagnosis
    assert f"exatrain: job {j['job']} requeued after a hang (gen2 excluded)" in log, log[-6000:]
    # the requeued run: on two nodes other than gen2, from the step-5 checkpoint, nothing lost
    assert expand_nodelist(j["nodes"]) == ["gen1", "gen3"] and j["excluded"] == "gen2", j
    total = 2 * sum(range(1, STEPS + 1))
    assert f"attempt 1 ran steps 6-{STEPS}, total {total}" in log, log[-6000:]
    assert (run / "hang" / "requeues").read_text().split() == [j["job"]]  # one hang requeue, counted
    assert not (run / "hang" / "exclude").exists()  # consumed by the batch script
