"""The affinity check on real processes: `exatrain train` started under `taskset` with a CPU mask other than
the one the site profile expects is reported in the rank-0 table (warn) and fails the run (strict); in
torchrun mode exatrain's trainer and the script runner (users' scripts) bind each worker to its mask.

The profile is a user file (the bundled `cpu` profile plus one mask per local rank: rank 0 -> core 0,
rank 1 -> core 1); the wrong mask is real: taskset pins the whole process tree to core 1."""

import os
import re
import shutil
import subprocess

import pytest

from exatrain.launch.local import agent_command
from exatrain.slurm.profiles import PROFILE_DIR
from exatrain.slurm.rank_command import SCRIPT_RUNNER
from tests.conftest import clean_environment, run_exatrain

TINY = [
    "--train.steps=2",
    "--train.log_every=1",
    "--train.eval_every=0",
    "--train.eval_batches=1",
    "--train.eval_at_start=false",
    "--train.global_batch_size=4",
    "--train.micro_batch_size=2",
    "--data.seq_len=16",
    "--train.save_model=false",
]

pytestmark = pytest.mark.skipif(
    shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2,
    reason="needs taskset and at least 2 cores",
)


@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "pinned.toml"
    path.write_text(
        (PROFILE_DIR / "cpu.toml").read_text().replace("cpu_masks = []", 'cpu_masks = ["0x1", "0x2"]')
    )
    return str(path)


def test_wrong_mask_is_reported_in_the_table(tmp_path, profile):
    r = run_exatrain(
        ["train", "--nproc=2", f"--job.profile={profile}", f"--run.dir={tmp_path}/run", *TINY],
        cwd=tmp_path,
        timeout=300,
        wrap=["taskset", "-c", "1"],
    )
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line[:2] in ("0 ", "1 ")}
    assert rows["0"].split()[2:5] == ["cpu", "0", "1"] and "MISMATCH: lacks 0, also on 1" in rows["0"], (
        r.stdout
    )
    assert rows["1"].split()[2:6] == ["cpu", "1", "1", "ok"], r.stdout
    assert "WARNING: CPU affinity mismatch: rank 0" in r.stdout and "HINT:" in r.stdout
    assert (tmp_path / "run" / "summary.json").is_file()  # warn: training went on


def test_strict_fails_the_run(tmp_path, profile):
    r = run_exatrain(
        [
            "train",
            "--nproc=1",
            "--affinity=strict",
            f"--job.profile={profile}",
            f"--run.dir={tmp_path}/run",
            *TINY,
        ],
        cwd=tmp_path,
        timeout=300,
        wrap=["taskset", "-c", "1"],
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "CPU affinity mismatch (dist.affinity=strict): rank 0" in r.stderr and "HINT:" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "run" / "summary.json").exists()
    # the same run on the expected core passes
    ok = run_exatrain(
        [
            "train",
            "--nproc=1",
            "--dist.affinity=strict",
            f"--job.profile={profile}",
            f"--run.dir={tmp_path}/ok",
            *TINY,
        ],
        cwd=tmp_path,
        timeout=300,
        wrap=["taskset", "-c", "0"],
    )
    assert ok.returncode == 0, ok.stderr


def test_torchrun_mode_workers_bind_themselves_to_their_masks(tmp_path, profile):
    """launch = "torchrun": one task holds every core of the node, so each worker binds itself to its mask
    before it allocates (here: worker 0 -> core 0, worker 1 -> core 1, really applied by the kernel); a mask
    the task does not hold is left alone and said so."""
    r = run_exatrain(
        [
            "train",
            "--nproc=2",
            "--job.launch=torchrun",
            f"--job.profile={profile}",
            f"--run.dir={tmp_path}/run",
            *TINY,
        ],
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line[:2] in ("0 ", "1 ")}
    assert rows["0"][2:6] == ["cpu", "0", "0", "ok"] and rows["1"][2:6] == ["cpu", "1", "1", "ok"], r.stdout
    assert "each worker bound itself to the profile's mask" in r.stdout
    # the thread count per worker is chosen and said once, instead of torchrun's banner
    assert (
        "Setting OMP_NUM_THREADS" not in r.stderr
        and r.stderr.count("exatrain: OMP_NUM_THREADS=1 per worker") == 1
    )
    held = run_exatrain(
        [
            "train",
            "--nproc=2",
            "--job.launch=torchrun",
            f"--job.profile={profile}",
            f"--run.dir={tmp_path}/held",
            *TINY,
        ],
        cwd=tmp_path,
        timeout=300,
        wrap=["taskset", "-c", "1"],
    )
    assert held.returncode == 0, held.stderr
    assert "worker 0 not bound to its mask (cores 0): its task holds only 1" in held.stdout, held.stdout


# A user's script that knows nothing of exatrain: it prints the cores it runs on and its own arguments.
SHOW_CORES = """import os, sys
cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
# one write per line: torchrun's workers run unbuffered (python -u), where print() writes the text and the
# newline separately, so the other worker's line could land between them
os.write(1, f"worker {os.environ['LOCAL_RANK']} cores {cores} args {' '.join(sys.argv[1:])}\\n".encode())
"""


def _runner_workers(tmp_path, option, env=None, wrap=()):
    """Two torchrun workers (exatrain's local launcher: torchrun's agent) run show_cores.py through the script
    runner with ``option`` (the job's masks, as the torchrun-mode sbatch script passes them)."""
    (tmp_path / "show_cores.py").write_text(SHOW_CORES)
    cmd = [*wrap, *agent_command(2, ["-m", SCRIPT_RUNNER, option, "show_cores.py", "--lr", "1"])]
    r = subprocess.run(
        cmd, cwd=tmp_path, env=clean_environment(env), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stdout + r.stderr
    found = re.findall(r"^worker (\d) cores ([\d,]+) args --lr 1$", r.stdout, re.MULTILINE)
    cores = {int(worker): [int(c) for c in listed.split(",")] for worker, listed in found}
    print(f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}")  # shown when an assertion on the result fails
    return cores, r.stderr


def test_script_runner_binds_each_worker_of_a_users_script_to_its_mask(tmp_path):
    """torchrun mode with an unmodified script: the runner binds worker i to mask i (CPU nodes: per local
    rank) before the script starts, silently, and the script never sees the runner's option."""
    cores, err = _runner_workers(tmp_path, "--cpu-masks=0x1,0x2")
    assert cores == {0: [0], 1: [1]}, cores
    assert "not bound" not in err, err


def test_script_runner_picks_the_mask_of_the_physical_gpu(tmp_path):
    """Per-GPU masks go by the node's GPU behind the local rank (visibility variables, as exatrain.init and
    the affinity table read them): with CUDA_VISIBLE_DEVICES=1,0 worker 0 drives GPU 1 and gets mask 1.
    No GPU is used here (the script imports no torch): only the variable the mapping reads is faked."""
    cores, err = _runner_workers(tmp_path, "--gpu-cpu-masks=0x1,0x2", env={"CUDA_VISIBLE_DEVICES": "1,0"})
    assert cores == {0: [1], 1: [0]}, cores
    assert "not bound" not in err, err


def test_script_runner_leaves_a_worker_whose_task_lacks_its_cores_and_says_why(tmp_path):
    """`taskset -c 0`: the task holds core 0 only, so worker 1 (mask 0x2 = core 1) stays where it is and
    prints one line why; worker 0 is bound to core 0 and says nothing."""
    cores, err = _runner_workers(tmp_path, "--cpu-masks=0x1,0x2", wrap=["taskset", "-c", "0"])
    assert cores == {0: [0], 1: [0]}, cores
    lines = [line for line in err.splitlines() if "not bound" in line]
    assert lines == [
        "exatrain: torchrun mode: worker 1 not bound to its mask (cores 1): its task holds only 0"
    ], err
