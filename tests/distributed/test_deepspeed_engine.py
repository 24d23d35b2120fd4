"""[engine] name = "deepspeed" on real gloo groups (2 workers under `exatrain train --nproc=2`, DeepSpeed's
CPU accelerator): ZeRO stages 1, 2 and 3 against torch DDP at 2 ranks, and resume from DeepSpeed's own
checkpoints.

Same model seed, same global batch per step, fp32, dropout 0, gradient accumulation 2 and clipping active (the
[train] keys DeepSpeed's generated config takes over). Only float summation order differs (ZeRO reduces
gradients in buckets, reduce-scatter instead of all-reduce). Tolerances, as for DDP against one process: 1e-5
absolute on every step's loss and gradient norm, 5e-5 absolute on every final weight.
"""

import json
import shutil

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
LOSS_TOL, WEIGHT_TOL = 1e-5, 5e-5
DS = ["--engine.name=deepspeed"]


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    return train_run(tmp_path_factory.mktemp("ddp"), "ddp", 2, COMMON)


def _max_weight_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stage_matches_ddp(ddp, tmp_path, stage):
    """Stage 2 also takes a user's DeepSpeed JSON that adds keys without contradicting exatrain's."""
    extra = []
    if stage == 2:
        (tmp_path / "ds.json").write_text(
            json.dumps({"zero_optimization": {"reduce_bucket_size": 100000}, "train_batch_size": "auto"})
        )
        extra = [f"--engine.deepspeed_config={tmp_path / 'ds.json'}"]
    run = train_run(tmp_path, f"zero{stage}", 2, [*COMMON, *DS, f"--engine.zero_stage={stage}", *extra])
    assert len(run["losses"]) == 4
    assert max_diff(run["losses"], ddp["losses"]) <= LOSS_TOL, (run["losses"], ddp["losses"])
    assert min(ddp["grad_norms"]) > 0.5, "clipping should be active at every step"
    assert max_diff(run["grad_norms"], ddp["grad_norms"]) <= LOSS_TOL, (run["grad_norms"], ddp["grad_norms"])
    assert _max_weight_diff(run["final"], ddp["final"]) <= WEIGHT_TOL
    assert "global batch 16 = 4 x 2 accum x 2" in run["stdout"]


def test_resume_equals_uninterrupted_run_and_keeps_k(tmp_path):
    """ZeRO-3 (parameters, gradients and optimizer state sharded): 6 steps saving every 2 with keep=2 leaves
    step-4 and step-6; a new run directory holding only step-4 resumes (resume=auto) and its steps 5-6 and
    final weights equal the uninterrupted run's exactly. The same checkpoint at another world size is refused
    with a HINT."""
    args = [
        *COMMON,
        "--train.steps=6",
        *DS,
        "--engine.zero_stage=3",
        "--checkpoint.interval=2",
        "--checkpoint.keep=2",
    ]
    full = train_run(tmp_path, "full", 2, args)
    ckpts = sorted(p.name for p in (full["dir"] / "checkpoints").iterdir())
    assert ckpts == ["step-4", "step-6"], ckpts
    resumed_dir = tmp_path / "resumed" / "checkpoints"
    resumed_dir.mkdir(parents=True)
    shutil.copytree(full["dir"] / "checkpoints" / "step-4", resumed_dir / "step-4")
    resumed = train_run(tmp_path, "resumed", 2, [*args, "--checkpoint.resume=auto"])
    assert "resumed from" in resumed["stdout"] and "at step 4" in resumed["stdout"]
    assert resumed["losses"] == full["losses"][4:]
    assert _max_weight_diff(resumed["final"], full["final"]) == 0.0

    from tests.conftest import run_exatrain

    r = run_exatrain(
        ["train", "--nproc=1", f"--run.dir={tmp_path / 'resumed'}", *args, "--checkpoint.resume=auto"],
        cwd=tmp_path,
    )
    assert r.returncode != 0
    assert "saved by 2 rank(s), this run has 1" in r.stderr and "HINT: resume with 2 rank(s)" in r.stderr, (
        r.stderr[-3000:]
    )
    _other_stage_refused(tmp_path / "resumed", args)


def _other_stage_refused(run_dir, args):
    """docs/engines.md: "every checkpoint only into its own ZeRO stage: anything else is refused with a HINT".
    The ZeRO-3 checkpoint resumed at the same world size (2) but stage 2 (a stage the universal path serves,
    so only the stage check can stop it): the error names both stages, the HINT the stage and the exporter."""
    from tests.conftest import run_exatrain

    stage2 = [a for a in args if not a.startswith("--engine.zero_stage")] + ["--engine.zero_stage=2"]
    checkpoints = (run_dir / "checkpoints").iterdir()
    latest = max(checkpoints, key=lambda p: int(p.name.split("-")[1]))  # the one resume=auto takes
    r = run_exatrain(
        ["train", "--nproc=2", f"--run.dir={run_dir}", *stage2, "--checkpoint.resume=auto"],
        cwd=run_dir.parent,
    )
    assert r.returncode != 0
    problem = f"checkpoint {latest}: saved with ZeRO stage 3, this run uses stage 2"
    assert problem in r.stderr, r.stderr[-3000:]
    hint = r.stderr.split("HINT: ", 1)[1]
    assert hint.startswith("resume with 2 rank(s) and --engine.zero_stage=3"), r.stderr[-3000:]
    assert f"zero_to_fp32.py {latest} OUT_DIR" in " ".join(hint.split()), hint
