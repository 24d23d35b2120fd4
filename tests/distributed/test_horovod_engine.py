"""[engine] name = "horovod" on 2 real ranks started by `exatrain train --nproc=2` (not horovodrun): Horovod's
gloo controller is initialised from exatrain's environment, rank 0 hosting the rendezvous.

Against torch DDP at 2 ranks with the same seed, global batch, accumulation 2 and active clipping (fp32):
Horovod averages gradients with its own allreduce, so only summation order differs. Tolerances as for DDP:
1e-5 on losses and gradient norms, 5e-5 on final weights. Horovod is built by scripts/install.sh horovod
(scripts/test.sh does it): its absence fails this test, it is not skipped.
"""

import pytest

from tests.distributed.cli_runs import max_diff, train_run

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
    "--train.grad_clip=0.5",
    "--data.seq_len=32",
]


def test_horovod_is_installed():
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        pytest.fail(f"horovod is not installed ({exc}): run bash scripts/install.sh horovod")
    assert hvd.gloo_built()


def test_two_horovod_ranks_match_ddp_and_resume(tmp_path):
    """Also: exatrain's checkpoints of the unwrapped model and optimizer resume a Horovod run exactly."""
    ddp = train_run(tmp_path, "ddp", 2, COMMON)
    hvd = train_run(tmp_path, "hvd", 2, [*COMMON, "--engine.name=horovod", "--checkpoint.interval=2"])
    assert max_diff(hvd["losses"], ddp["losses"]) <= 1e-5, (hvd["losses"], ddp["losses"])
    assert min(ddp["grad_norms"]) > 0.5, "clipping should be active at every step"
    assert max_diff(hvd["grad_norms"], ddp["grad_norms"]) <= 1e-5
    assert max((hvd["final"][k] - ddp["final"][k]).abs().max().item() for k in ddp["final"]) <= 5e-5
    import shutil

    (tmp_path / "again" / "checkpoints").mkdir(parents=True)
    shutil.copytree(hvd["dir"] / "checkpoints" / "step-2", tmp_path / "again" / "checkpoints" / "step-2")
    again = train_run(tmp_path, "again", 2, [*COMMON, "--engine.name=horovod", "--checkpoint.resume=auto"])
    assert again["losses"] == hvd["losses"][2:]
