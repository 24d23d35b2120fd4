"""`exatrain run` from the command line: example (d), an unmodified torchrun-style DDP script, in two local
workers under torchrun's agent; the per-rank wrapper under torchrun and under srun's variables; bad input
(each a message naming it, a HINT, no traceback); a failing rank named and its exit code passed through."""

import json
import socket
import subprocess
import sys

import pytest

from tests.conftest import ROOT, clean_environment, run_exatrain

pytestmark = pytest.mark.e2e

EXAMPLE = ROOT / "examples" / "torchrun_ddp" / "train.py"
SHOW = (
    "import json, os, sys\n"
    "names = 'RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK MASTER_ADDR MASTER_PORT "
    "TORCHELASTIC_RUN_ID'\n"
    # one write: ranks share the pipe
    "sys.stdout.write(json.dumps({'pid': os.getpid(), 'argv': sys.argv[1:], "
    "**{n: os.environ.get(n) for n in names.split()}}) + '\\n')\n"
    "sys.exit(int(os.environ.get('EXIT_ON_RANK_1', '0')) if os.environ.get('RANK') == '1' else 0)\n"
)


def test_example_in_two_local_workers(tmp_path):
    """The README's command: `exatrain run --nproc 2 examples/torchrun_ddp/train.py --epochs 3`."""
    r = run_exatrain(["run", "--nproc", "2", str(EXAMPLE), "--epochs", "3"], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    ranks = [json.loads((tmp_path / "ddp-ranks" / f"rank-{i}.json").read_text()) for i in range(2)]
    seen = [x["seen"] for x in ranks]
    assert [
        (s["RANK"], s["WORLD_SIZE"], s["LOCAL_RANK"], s["LOCAL_WORLD_SIZE"], s["GROUP_RANK"]) for s in seen
    ] == [("0", "2", "0", "2", "0"), ("1", "2", "1", "2", "0")]
    assert (
        seen[0]["MASTER_ADDR"] == seen[1]["MASTER_ADDR"] and seen[0]["MASTER_PORT"] == seen[1]["MASTER_PORT"]
    )
    assert ranks[0]["losses"][2] < ranks[0]["losses"][0]  # it trained
    assert ranks[0]["checksum"] == ranks[1]["checksum"]  # DDP kept the replicas equal
    assert "epoch 2: loss" in r.stdout and "Traceback" not in r.stderr


LEFT_IN_A_CYCLE = """import sys
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Model(DDP):
    def __del__(self):
        sys.stdout.write(f"rank {self.rank}: model freed while finalizing: {sys.is_finalizing()}\\n")


dist.init_process_group("gloo")
model = Model(nn.Linear(4, 1))
model.rank, model.cycle = dist.get_rank(), model
model(torch.ones(2, 4)).sum().backward()
dist.destroy_process_group()  # the model still holds the process group (and so its gloo threads)
"""


def test_a_model_left_in_a_cycle_is_freed_before_python_finalizes(tmp_path):
    """The DDP model (and with it the process group, whose gloo threads may still be about to drop tensors)
    is freed while Python is alive, not in the final collection during finalization, where a gloo thread
    reaching for the GIL aborts the process (pytorch/pytorch#190489; see exatrain/launch/script_runner.py)."""
    (tmp_path / "cycle.py").write_text(LEFT_IN_A_CYCLE)
    r = run_exatrain(["run", "--nproc", "2", "cycle.py"], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(r.stdout.splitlines()) == [
        f"rank {i}: model freed while finalizing: False" for i in range(2)
    ]


def test_failing_rank_is_named_and_its_exit_code_passed_through(tmp_path):
    """Run on one core (taskset), so two workers also get the note that they share it."""
    (tmp_path / "show.py").write_text(SHOW)
    r = run_exatrain(
        ["run", "--nproc", "2", "show.py"],
        cwd=tmp_path,
        env={"EXIT_ON_RANK_1": "3"},
        wrap=("taskset", "-c", "0"),
    )
    assert r.returncode == 3, r.stdout + r.stderr
    assert "exatrain: error: rank 1 (local rank 1" in r.stderr and "exit code 3" in r.stderr
    assert "HINT:" in r.stderr and "Traceback" not in r.stderr
    assert "note: 2 workers share 1 CPU core(s)" in r.stderr


def test_error_reported_through_torchruns_error_file_is_quoted(tmp_path):
    """A script whose main has torch's @record writes its exception to torchrun's error file: exatrain quotes
    it."""
    (tmp_path / "boom.py").write_text(
        "import os\nfrom torch.distributed.elastic.multiprocessing.errors import "
        "record\n\n@record\ndef main():\n"
        "    if os.environ['RANK'] == '1':\n        raise ValueError('bad batch in shard 7')\n\nmain()\n"
    )
    r = run_exatrain(["run", "--nproc", "2", "boom.py"], cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert (
        "exatrain: error: rank 1 (local rank 1" in r.stderr
        and "bad batch in shard 7" in r.stderr.split("exatrain: error:")[1]
    )


def test_max_restarts_restarts_the_workers(tmp_path):
    """Rank 1 fails in the first attempt only: with --max-restarts 1 the agent starts the group again and
    the run succeeds (the agent gets TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, as `exatrain train` does)."""
    (tmp_path / "flaky.py").write_text(
        # one write per line: the two workers share the pipe,
        # and print() under `python -u` writes word by word
        "import os, sys\nos.write(1, ('attempt %s rank %s %s\\n' % "
        "(os.environ['TORCHELASTIC_RESTART_COUNT'], "
        "os.environ['RANK'], os.environ.get('TORCH_DISABLE_SHARE_RDZV_TCP_STORE'))).encode())\n"
        "sys.exit(4 if os.environ['RANK'] == '1' and os.environ['TORCHELASTIC_RESTART_COUNT'] == "
        "'0' else 0)\n"
    )
    r = run_exatrain(["run", "--nproc", "2", "--max-restarts", "1", "flaky.py"], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "attempt 1 rank 1 1" in r.stdout and "attempt 1 rank 0 1" in r.stdout


def _slurm_task(rank):
    """The variables srun sets for task `rank` of a 2-task step on this machine (a stand-in for srun: the real
    one runs in tests/slurm/test_run_script.py)."""
    return {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank),
        "SLURM_NODEID": "0",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": socket.gethostname(),
        "SLURM_STEP_TASKS_PER_NODE": "2",
        "CUDA_VISIBLE_DEVICES": "",
    }


def test_rank_wrapper_becomes_the_script(tmp_path):
    """Under srun's variables `exatrain run` sets torchrun's and replaces itself with the script: the script
    runs with the PID srun started (so SLURM's signals reach it) and its exit code is the task's."""
    (tmp_path / "show.py").write_text(SHOW)
    seen = []
    for rank in (0, 1):
        proc = subprocess.Popen(
            [sys.executable, "-m", "exatrain.cli.main", "run", "show.py", "--flag"],
            cwd=tmp_path,
            env=clean_environment({**_slurm_task(rank), "EXIT_ON_RANK_1": "5"}),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == (5 if rank else 0), err
        seen.append(json.loads(out))
        assert seen[-1]["pid"] == proc.pid and seen[-1]["argv"] == ["--flag"]
    assert [
        (s["RANK"], s["LOCAL_RANK"], s["WORLD_SIZE"], s["LOCAL_WORLD_SIZE"], s["GROUP_RANK"]) for s in seen
    ] == [("0", "0", "2", "2", "0"), ("1", "1", "2", "2", "0")]
    assert {s["MASTER_ADDR"] for s in seen} == {socket.gethostname()}
    assert len({s["MASTER_PORT"] for s in seen}) == 1


def test_rank_wrapper_frees_what_the_script_left_before_python_finalizes(tmp_path):
    """Per rank (srun's variables) the script also runs through the script runner: an object it left in a
    reference cycle is freed before finalization (plain python frees it during; see test_script_runner)."""
    (tmp_path / "cycle.py").write_text(
        "import sys\n\n\nclass Model:\n    def __del__(self):\n"
        "        print('freed while finalizing:', sys.is_finalizing(), flush=True)\n\n\n"
        "model = Model()\nmodel.self = model\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "exatrain.cli.main", "run", "cycle.py"],
        cwd=tmp_path,
        env=clean_environment(_slurm_task(0)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "freed while finalizing: False"


def test_master_options(tmp_path):
    """--resolve-master gives an IP and --master-port the port; --profile juwels-booster adds JSC's suffix
    'i' to the host name, which does not resolve here: refused at once, naming it."""
    (tmp_path / "show.py").write_text(SHOW)
    env = clean_environment(_slurm_task(0))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "exatrain.cli.main",
            "run",
            "--resolve-master",
            "--master-port",
            "29877",
            "show.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert (seen["MASTER_ADDR"], seen["MASTER_PORT"]) == (socket.gethostbyname(socket.gethostname()), "29877")
    r = subprocess.run(
        [sys.executable, "-m", "exatrain.cli.main", "run", "--profile", "juwels-booster", "show.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and f"cannot resolve the master host '{socket.gethostname()}i'" in r.stderr, (
        r.stderr
    )
    assert "HINT:" in r.stderr and "Traceback" not in r.stderr


def test_under_torchrun_the_agents_variables_are_kept(tmp_path):
    (tmp_path / "show.py").write_text(SHOW)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "exatrain.cli.main",
            "run",
            "show.py",
        ],
        cwd=tmp_path,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    seen = sorted(
        (json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")), key=lambda s: s["RANK"]
    )
    assert [(s["RANK"], s["WORLD_SIZE"], s["LOCAL_RANK"]) for s in seen] == [("0", "2", "0"), ("1", "2", "1")]
    assert all(s["TORCHELASTIC_RUN_ID"] for s in seen) and len({s["MASTER_PORT"] for s in seen}) == 1


BAD = {
    "missing script": (["run", "nothere.py"], {}, "'nothere.py' does not exist"),
    "not a Python file": (["run", "job.sh"], {}, "'job.sh' is not a Python script"),
    "-m without a module": (["run", "--nproc", "2", "-m"], {}, "-m needs a module name"),
    "no script": (["run", "--nproc", "2"], {}, "no script given"),
    "unknown module": (["run", "-m", "no_such_module_here"], {}, "no module named 'no_such_module_here'"),
    "batch shell": (
        ["run", "show.py"],
        {"SLURM_JOB_ID": "99", "SLURM_NTASKS": "4"},
        "batch shell, not a job step",
    ),
    "nproc 0": (["run", "--nproc", "0", "show.py"], {}, "--nproc"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_explained(name, tmp_path):
    (tmp_path / "job.sh").write_text("#!/bin/bash\necho hi\n")
    (tmp_path / "show.py").write_text(SHOW)
    args, env, needle = BAD[name]
    r = run_exatrain(args, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert needle in r.stderr and "HINT:" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_rank_wrapper_imports_no_torch(tmp_path):
    """The wrapper is launch-layer code: before it becomes the script it has not imported torch (each rank
    would pay for torch's import twice)."""
    (tmp_path / "show.py").write_text(SHOW)
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "exatrain.cli.main", "run", "show.py"],
        cwd=tmp_path,
        env=clean_environment(_slurm_task(0)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and json.loads(r.stdout)["RANK"] == "0", r.stderr
    imported = {line.split("|")[-1].strip().split(".")[0] for line in r.stderr.splitlines() if "|" in line}
    assert "exatrain" in imported and "torch" not in imported
