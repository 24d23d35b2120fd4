"""The affinity check on real processes: `exatrain train` started under `taskset` with a CPU mask other than
the one the site profile expects is reported in the rank-0 table (warn) and fails the run (strict).

The profile is a user file (the bundled `cpu` profile plus one mask per local rank: rank 0 -> core 0,
rank 1 -> core 1); the wrong mask is real: taskset pins the whole process tree to core 1."""

import os
import shutil

import pytest

from exatrain.launch.profiles import PROFILE_DIR
from tests.conftest import run_exatrain

TINY = ["--train.steps=2", "--train.log_every=1", "--train.eval_every=0", "--train.eval_batches=1",
        "--train.eval_at_start=false", "--train.global_batch_size=4", "--train.micro_batch_size=2",
        "--data.seq_len=16", "--train.save_model=false"]

pytestmark = pytest.mark.skipif(shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2,
                                reason="needs taskset and at least 2 cores")


@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "pinned.toml"
    path.write_text((PROFILE_DIR / "cpu.toml").read_text().replace('cpu_masks = []', 'cpu_masks = ["0x1", "0x2"]'))
    return str(path)


def test_wrong_mask_is_reported_in_the_table(tmp_path, profile):
    r = run_exatrain(["train", "--nproc=2", f"--job.profile={profile}", f"--run.dir={tmp_path}/run", *TINY],
                     cwd=tmp_path, timeout=300, wrap=["taskset", "-c", "1"])
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line[:2] in ("0 ", "1 ")}
    assert rows["0"].split()[2:5] == ["cpu", "0", "1"] and "MISMATCH: lacks 0, also on 1" in rows["0"], r.stdout
    assert rows["1"].split()[2:6] == ["cpu", "1", "1", "ok"], r.stdout
    assert "WARNING: CPU affinity mismatch: rank 0" in r.stdout and "HINT:" in r.stdout
    assert (tmp_path / "run" / "summary.json").is_file()  # warn: training went on


def test_strict_fails_the_run(tmp_path, profile):
    r = run_exatrain(["train", "--nproc=1", "--affinity=strict", f"--job.profile={profile}",
                      f"--run.dir={tmp_path}/run", *TINY], cwd=tmp_path, timeout=300, wrap=["taskset", "-c", "1"])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "CPU affinity mismatch (dist.affinity=strict): rank 0" in r.stderr and "HINT:" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "run" / "summary.json").exists()
    # the same run on the expected core passes
    ok = run_exatrain(["train", "--nproc=1", "--dist.affinity=strict", f"--job.profile={profile}",
                       f"--run.dir={tmp_path}/ok", *TINY], cwd=tmp_path, timeout=300, wrap=["taskset", "-c", "0"])
    assert ok.returncode == 0, ok.stderr


def test_torchrun_mode_workers_bind_themselves_to_their_masks(tmp_path, profile):
    """launch = "torchrun": one task holds every core of the node, so each worker binds itself to its mask
    before it allocates (here: worker 0 -> core 0, worker 1 -> core 1, really applied by the kernel); a mask
    the task does not hold is left alone and said so."""
    r = run_exatrain(["train", "--nproc=2", "--job.launch=torchrun", f"--job.profile={profile}",
                      f"--run.dir={tmp_path}/run", *TINY], cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line[:2] in ("0 ", "1 ")}
    assert rows["0"][2:6] == ["cpu", "0", "0", "ok"] and rows["1"][2:6] == ["cpu", "1", "1", "ok"], r.stdout
    assert "each worker bound itself to the profile's mask" in r.stdout
    # the thread count per worker is chosen and said once, instead of torchrun's banner
    assert "Setting OMP_NUM_THREADS" not in r.stderr and r.stderr.count("exatrain: OMP_NUM_THREADS=1 per worker") == 1
    held = run_exatrain(["train", "--nproc=2", "--job.launch=torchrun", f"--job.profile={profile}",
                         f"--run.dir={tmp_path}/held", *TINY], cwd=tmp_path, timeout=300, wrap=["taskset", "-c", "1"])
    assert held.returncode == 0, held.stderr
    assert "worker 0 not bound to its mask (cores 0): its task holds only 1" in held.stdout, held.stdout
