"""DCP checkpoints of sharded layouts: an FSDP run's checkpoint resumes in other layouts (one process,
tensor parallel) and continues with the same losses.

Tolerance: 1e-5 absolute on every loss after the resume (only float summation order differs).
"""

import shutil

import pytest

from tests.conftest import run_exatrain
from tests.distributed.helpers import batch_digests, train_losses

pytestmark = pytest.mark.dist

COMMON = [
    "--train.steps=4",
    "--train.log_every=1",
    "--train.eval_every=0",
    "--train.eval_at_start=false",
    "--train.eval_batches=2",
    "--train.global_batch_size=16",
    "--train.micro_batch_size=4",
    "--train.warmup_steps=2",
    "--data.seq_len=32",
    "--checkpoint.interval=2",
    "--checkpoint.keep=0",
]
TOL = 1e-5


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    """4 steps of FSDP on 2 ranks, checkpoints at steps 2 and 4."""
    tmp = tmp_path_factory.mktemp("fsdp_ckpt")
    run = tmp / "fsdp"
    r = run_exatrain(
        [
            "train",
            "--nproc=2",
            f"--run.dir={run}",
            *COMMON,
            "--parallel.dp_replicate=1",
            "--parallel.dp_shard=2",
        ],
        cwd=tmp,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return run


@pytest.mark.parametrize(
    "nproc, layout",
    [
        (1, []),
        (2, ["--parallel.dp_replicate=1", "--parallel.tp=2"]),
    ],
    ids=["single_process", "tensor_parallel"],
)
def test_fsdp_checkpoint_resumes_in_another_layout(fsdp_run, tmp_path, nproc, layout):
    run = tmp_path / "resumed"
    shutil.copytree(fsdp_run / "checkpoints" / "step-2", run / "checkpoints" / "step-2")
    r = run_exatrain(
        ["train", f"--nproc={nproc}", f"--run.dir={run}", *COMMON, *layout, "--checkpoint.resume=auto"],
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    assert "resumed from" in r.stdout and "at step 2" in r.stdout
    full, resumed = train_losses(fsdp_run), train_losses(run)
    assert sorted(resumed) == [3, 4]
    assert max(abs(full[s] - resumed[s]) for s in resumed) <= TOL, (full, resumed)
    assert batch_digests(run) == {s: d for s, d in batch_digests(fsdp_run).items() if s > 2}
