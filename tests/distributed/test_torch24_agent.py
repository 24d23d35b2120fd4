"""exatrain's agent on the oldest torch pyproject.toml allows (2.4: tests/torch24, a stand-in for its
torchrun, with torch 2.4.0 in the package metadata the agent reads): the pre-timeout signal still reaches the
workers and the agent waits for their checkpoint, where 2.4's own torchrun dies of SIGUSR2 and forwards
nothing; a torch older than the floor stops the agent at once with a HINT.

The stand-in runs torch 2.13's launcher behind 2.4's parser and signal settings (tests/torch24/run24.py says
what it does not reproduce). The signal is sent to the agent alone, as SLURM's process-group tracking of the
test cluster delivers it (the workers run in sessions of their own)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from exatrain.observe import read_metrics
from tests.conftest import clean_environment, finish, started_exatrain, wait_for
from tests.torch24.overlay import make_overlay

pytestmark = pytest.mark.dist

WORKER = Path(__file__).parents[1] / "torch24" / "usr2_worker.py"
TORCHRUN_ARGS = ["--standalone", "--nproc-per-node=2", "--no-python", sys.executable, str(WORKER)]


def _start(cmd, tmp_path, env):
    err = (tmp_path / "agent.err").open("w")
    return subprocess.Popen(cmd, cwd=tmp_path, env=clean_environment(env), stdout=err, stderr=err, text=True)


def _ready(out):
    return lambda: (
        [int((out / f"ready-{r}").read_text()) for r in (0, 1)]
        if all(
            (out / f"ready-{r}").is_file() and (out / f"ready-{r}").read_text().endswith("\n") for r in (0, 1)
        )
        else None
    )


def test_agent_forwards_usr2_and_waits_for_the_checkpoint_on_torch_24(tmp_path):
    env = make_overlay(tmp_path / "torch24", "2.4.0")
    out = tmp_path / "out"
    out.mkdir()
    agent = [
        sys.executable,
        "-m",
        "exatrain.launch.agent",
        "--handle-signals=SIGUSR2",
        "--shutdown-grace=120",
        "--",
        *TORCHRUN_ARGS,
        str(out),
    ]
    proc = _start(agent, tmp_path, {**env, "CHECKPOINT_DELAY": "2"})
    try:
        wait_for(_ready(out), 300, "both workers", proc)
        proc.send_signal(signal.SIGUSR2)
        code = proc.wait(timeout=120)
    finally:
        proc.kill()
    err = (tmp_path / "agent.err").read_text()
    assert code == 0, err
    assert "exatrain: the agent received SIGUSR2: passed it to workers" in err, err
    assert "--signals-to-handle" not in err
    for rank in (0, 1):  # each worker got the signal and ended after its checkpoint, not killed during it
        assert (out / f"got-{rank}").is_file() and (out / f"done-{rank}").is_file()


def test_workers_still_running_after_the_grace_are_stopped_as_torchrun_stops_them(tmp_path):
    """The lead time is the limit, as torchrun's --shutdown-timeout is: workers still checkpointing after it
    get SIGTERM (then SIGKILL 30 s later) and the agent exits 128 + SIGTERM."""
    env = make_overlay(tmp_path / "torch24", "2.4.0")
    out = tmp_path / "out"
    out.mkdir()
    agent = [
        sys.executable,
        "-m",
        "exatrain.launch.agent",
        "--handle-signals=SIGUSR2",
        "--shutdown-grace=2",
        "--",
        *TORCHRUN_ARGS,
        str(out),
    ]
    proc = _start(agent, tmp_path, {**env, "CHECKPOINT_DELAY": "600"})
    try:
        wait_for(_ready(out), 300, "both workers", proc)
        proc.send_signal(signal.SIGUSR2)
        code = proc.wait(timeout=120)
    finally:
        proc.kill()
    err = (tmp_path / "agent.err").read_text()
    assert code == 128 + signal.SIGTERM, err
    assert "waiting up to 2 s" in err and "the agent received SIGTERM and passed it to the workers" in err, (
        err
    )
    assert [p.name for p in sorted(out.glob("got-*"))] == ["got-0", "got-1"] and not list(out.glob("done-*"))


FORWARDER = """import os, signal, subprocess, sys, time
from exatrain.launch.agent import SignalForwarder
child = subprocess.Popen(["sleep", "30"]) if sys.argv[1] == "child" else None
SignalForwarder(["SIGUSR2"], None).install()
os.kill(os.getpid(), signal.SIGUSR2)
time.sleep(0.5)
print("survived", child.wait() if child else None)
"""


@pytest.mark.parametrize("children", ["child", "none"])
def test_a_signal_before_the_workers_exist_ends_the_agent(children):
    """The forwarder passes the signal to the agent's children and the agent lives on; with no children yet
    (before torch's agent started the workers) the signal ends it, as it ends torchrun's agent then."""
    r = subprocess.run(
        [sys.executable, "-c", FORWARDER, children], capture_output=True, text=True, timeout=60
    )
    if children == "child":  # sleep got SIGUSR2 (its default action: it died of it)
        assert r.returncode == 0 and r.stdout == f"survived {-signal.SIGUSR2}\n", r.stderr
    else:
        assert r.returncode == -signal.SIGUSR2 and r.stdout == "", r.stderr


def test_torch_24s_own_torchrun_dies_of_usr2_and_forwards_nothing(tmp_path):
    """What the stand-in reproduces (and what exatrain's agent replaces): 2.4's agent has no handler for
    USR2."""
    env = make_overlay(tmp_path / "torch24", "2.4.0")
    out = tmp_path / "out"
    out.mkdir()
    proc = _start(["torchrun", *TORCHRUN_ARGS, str(out)], tmp_path, env)
    pids = []
    try:
        pids = wait_for(_ready(out), 300, "both workers", proc)
        proc.send_signal(signal.SIGUSR2)
        assert proc.wait(timeout=60) == -signal.SIGUSR2
        for pid in pids:  # orphaned, still waiting for a signal that never came
            os.kill(pid, 0)
        assert not list(out.glob("got-*"))
    finally:
        proc.kill()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_the_trainer_on_a_torch_older_than_it_imports_says_so_with_a_hint(tmp_path):
    env = make_overlay(tmp_path / "torch28", "2.8.0")
    r = subprocess.run(
        [sys.executable, "-m", "exatrain.cli.main", "train", "--nproc=2", f"--run.dir={tmp_path / 'r'}"],
        cwd=tmp_path,
        env=clean_environment(env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert (
        "torch 2.8.0 (of " in r.stderr
        and "older than 2.9, the oldest torch exatrain's reference trainer" in r.stderr
    )
    assert (
        "HINT: use torch>=2.9 for `exatrain train`, or run your own training script with `exatrain run`"
        in r.stderr
    )


@pytest.mark.parametrize("version", ["2.3.1", "2.2.2+rocm5.7"])
def test_a_torch_older_than_the_floor_stops_at_start_with_a_hint(tmp_path, version):
    env = make_overlay(tmp_path / "old", version)
    r = subprocess.run(
        [sys.executable, "-m", "exatrain.launch.agent", "--", *TORCHRUN_ARGS, str(tmp_path)],
        cwd=tmp_path,
        env=clean_environment(env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert (
        f"torch {version.split('+')[0]} (of {sys.executable}) is older than exatrain's floor 2.4" in r.stderr
    )
    assert "\nHINT: use torch>=2.4" in r.stderr
    assert not list(tmp_path.glob("ready-*"))  # no worker was started


ARGS = [
    "--train.steps=60",
    "--train.log_every=1",
    "--train.eval_every=0",
    "--train.eval_at_start=false",
    "--train.eval_batches=2",
    "--train.global_batch_size=8",
    "--train.micro_batch_size=4",
    "--data.seq_len=16",
    "--train.save_model=false",
]


def _step(run):
    try:
        return max(
            (m["step"] for m in read_metrics(run / "metrics.jsonl") if m["kind"] == "train"), default=0
        )
    except (OSError, ValueError):
        return 0


def test_exatrain_train_checkpoints_on_usr2_on_torch_29(tmp_path):
    """`exatrain train --nproc 2` (real gloo workers under the agent) on torch 2.9, the oldest the reference
    trainer imports (TRAINER_FLOOR) and LUMI's current containers' torch, whose torchrun has no
    --signals-to-handle either: USR2 -> every rank finishes its step, the checkpoint is committed, the run
    exits 75 ("checkpointed, continue"). The torchrun is the 2.4 stand-in (2.9's parser accepts all it
    does)."""
    env = make_overlay(tmp_path / "torch29", "2.9.1")
    run = tmp_path / "run"
    with started_exatrain(["train", "--nproc=2", f"--run.dir={run}", *ARGS], cwd=tmp_path, env=env) as proc:
        wait_for(lambda: _step(run) >= 3, 300, "step 3", proc)
        os.kill(proc.pid, signal.SIGUSR2)
        code, out, err = finish(proc)
    assert code == 75, out + err
    assert "passed it to workers" in err and "--signals-to-handle" not in err, err
    assert "signal SIGUSR2: checkpointing at step" in out and "committed" in out, out + err
