"""Example examples/horovod_own: a user's own Horovod script (hvd.DistributedOptimizer with
backward_passes_per_step, hvd.broadcast_parameters/broadcast_optimizer_state, a DistributedSampler over
hvd.size() ranks) started by `exatrain run` in 2 local ranks, Horovod's gloo controller set up by
exatrain.init_horovod from exatrain's environment (no horovodrun).

Its losses are compared with the same training written in plain torch in this process (one SGD with
momentum on the whole global batch, the sampler's permutation of the data): Horovod splits every global
batch over 2 ranks and 2 backward passes per rank and averages the gradients with its own allreduce, so
in fp32 the losses agree up to summation order (tolerance 1e-5). Horovod is built by
scripts/install.sh horovod (scripts/test.sh does it): its absence fails this test, it is not skipped."""

import json
import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from tests.conftest import ROOT, clean_environment, run_exatrain

pytestmark = pytest.mark.e2e

EXAMPLE = ROOT / "examples" / "horovod_own"
# as docs/own-code.md and the example's README say
COMMAND = ".venv/bin/exatrain run --nproc 2 examples/horovod_own/train.py"


def _example():
    """The example's own model and data (imported from its file, so the reference trains the same thing)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("horovod_own_train", EXAMPLE / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_losses(
    ex, epochs: int, samples: int, global_batch: int, lr: float, momentum: float
) -> list[float]:
    """Plain torch in one process: the whole global batch per step, SGD with momentum. The sampler with one
    replica gives the whole permutation; with W replicas rank r gets its entries r, r+W, ..., so the ranks'
    batches of step s together are exactly the permutation's s-th slice of global_batch samples."""
    torch.manual_seed(0)  # exatrain.init(seed=0) seeds the same way on every rank
    model = ex.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    dataset = ex.make_dataset(samples)
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=0)
    losses = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(dataset, batch_size=global_batch, sampler=sampler):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


def test_readmes_give_the_command_this_test_runs():
    assert COMMAND in (ROOT / "docs" / "own-code.md").read_text()
    assert COMMAND in (EXAMPLE / "README.md").read_text()


def _require_horovod():
    try:
        import horovod.torch  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"horovod is not installed ({exc}): run bash scripts/install.sh horovod")


def _defaults(ex):
    """The example's argparse defaults (what the README's command runs with)."""
    import sys
    from unittest import mock

    with mock.patch.object(sys, "argv", ["train.py"]):
        return ex.parse_args()


def test_own_horovod_script_trains_in_two_ranks_like_plain_torch(tmp_path):
    """The README's command, as written (defaults: 2 epochs of 64 samples, 4 per backward pass, 2 backward
    passes per allreduce: 8 steps of a global batch of 16); rank 0 writes horovod-own.json."""
    _require_horovod()
    executable, subcommand, *args = COMMAND.split()
    assert executable == ".venv/bin/exatrain" and args[2] == "examples/horovod_own/train.py"
    args[2] = str(ROOT / args[2])  # run from a fresh folder, as a user's own working directory
    r = run_exatrain([subcommand, *args], cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    out = json.loads((tmp_path / "horovod-own.json").read_text())
    assert (out["size"], out["local_size"]) == (2, 2), (
        out
    )  # Horovod itself counts the 2 ranks exatrain started

    ex = _example()
    defaults = _defaults(ex)
    global_batch = out["batch_size"] * out["batches_per_allreduce"] * out["size"]
    assert (out["batches_per_allreduce"], global_batch) == (2, 16)
    expected = reference_losses(
        ex, defaults.epochs, out["samples"], global_batch, defaults.lr, defaults.momentum
    )
    assert len(out["losses"]) == len(expected) == 8
    assert out["losses"] == pytest.approx(expected, abs=1e-5)
    frozen = reference_losses(ex, defaults.epochs, out["samples"], global_batch, 0.0, defaults.momentum)
    assert abs(out["losses"][-1] - frozen[-1]) > 1e-3  # it trained: the untrained model's loss differs


def test_own_horovod_script_runs_as_one_plain_process(tmp_path):
    """`python train.py` without any launcher: exatrain.init joins no process group, init_horovod still
    starts Horovod (size 1), and the 2 steps match plain torch on the same global batch of 8."""
    _require_horovod()
    r = subprocess.run(
        [sys.executable, str(EXAMPLE / "train.py"), "--epochs", "1", "--samples", "16"],
        cwd=tmp_path,
        env=clean_environment({"OMP_NUM_THREADS": "1"}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    out = json.loads((tmp_path / "horovod-own.json").read_text())
    assert out["size"] == 1, out
    ex = _example()
    defaults = _defaults(ex)
    expected = reference_losses(ex, 1, 16, 8, defaults.lr, defaults.momentum)
    assert len(out["losses"]) == len(expected) == 2
    assert out["losses"] == pytest.approx(expected, abs=1e-5)
