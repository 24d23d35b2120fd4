"""The README's FSDP x TP example: final weights gathered without DTensor's multi-dimensional
redistribution (which warned "may give inconsistent results between ranks" on every rank), and the
gathered final.pt holds whole tensors under the plain model's names, with the values a single process
reaches on the same batches (real gloo ranks).

The same seed, the same global batch (32 windows per step) and dropout 0 in both runs, and every layout
starts from the single process's initial weights (train/build.py): only float summation order differs.
1e-4 absolute on every weight is tests/distributed/test_parallel_parity.py's tolerance (measured there up
to 2.7e-5); a shard missing from the gather, or gathered twice, moves weights by far more."""

import pytest
import torch

from tests.conftest import run_exatrain

pytestmark = pytest.mark.dist


def test_fsdp_tp_run_gathers_its_weights_without_the_warning(tmp_path):
    run = tmp_path / "run"
    r = run_exatrain(
        [
            "train",
            "--nproc=4",
            "--parallel.dp_replicate=1",
            "--parallel.dp_shard=2",
            "--parallel.tp=2",
            "--parallel.sequence_parallel=true",
            "--train.micro_batch_size=8",
            "--data.seq_len=64",
            "--train.steps=2",
            "--train.eval_every=0",
            "--train.eval_at_start=false",
            f"--run.dir={run}",
        ],
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "inconsistent results between ranks" not in r.stdout + r.stderr
    final = torch.load(run / "final.pt")
    # whole tensors under the plain model's names and shapes (one process, the same model)
    single = tmp_path / "single"
    one = run_exatrain(
        [
            "train",
            "--nproc=1",
            "--train.micro_batch_size=8",
            "--data.seq_len=64",
            "--train.steps=2",
            "--train.eval_every=0",
            "--train.eval_at_start=false",
            f"--run.dir={single}",
        ],
        cwd=tmp_path,
    )
    assert one.returncode == 0, one.stderr
    plain = torch.load(single / "final.pt")
    assert {k: tuple(v.shape) for k, v in final.items()} == {k: tuple(v.shape) for k, v in plain.items()}
    far = {k: (final[k] - plain[k]).abs().max().item() for k in plain}
    assert max(far.values()) <= 1e-4, sorted(far.items(), key=lambda kv: -kv[1])[:5]
