"""ParallelDims: degrees resolved and checked against the world size and the model, before any
process group exists (so a wrong layout fails at once with a HINT)."""

import pytest

from exatrain.config import load_config
from exatrain.distributed.parallel_dims import ParallelDims
from exatrain.errors import ConfigError
from exatrain.models import model_shape
from exatrain.train.preflight import preflight


def dims(world, **degrees):
    cfg = load_config(None, [f"--parallel.{k}={v}" for k, v in degrees.items()]).parallel
    return ParallelDims.from_config(cfg, world)


def test_default_layout_is_ddp_over_all_ranks():
    d = dims(4)
    assert (d.pp, d.dp_replicate, d.dp_shard, d.tp) == (1, 4, 1, 1)
    assert d.ddp and not d.fsdp and d.dp == 4


@pytest.mark.parametrize(
    "world, degrees, expected",
    [
        (8, {"dp_replicate": 1, "dp_shard": -1, "tp": 2, "pp": 2}, (2, 1, 2, 2)),
        (16384, {"dp_replicate": 4, "dp_shard": -1, "tp": 8, "pp": 4}, (4, 4, 128, 8)),
        (4, {"dp_replicate": 2, "dp_shard": 2}, (1, 2, 2, 1)),
    ],
)
def test_infers_the_minus_one_degree(world, degrees, expected):
    d = dims(world, **degrees)
    assert (d.pp, d.dp_replicate, d.dp_shard, d.tp) == expected
    assert d.pp * d.dp * d.tp == world


def test_hsdp_fsdp_ddp_flags():
    assert dims(4, dp_replicate=2, dp_shard=2).hsdp
    f = dims(4, dp_replicate=1, dp_shard=4)
    assert f.fsdp and not f.hsdp and not f.ddp


@pytest.mark.parametrize(
    "world, degrees, needle",
    [
        (4, {"dp_replicate": 1, "dp_shard": 2, "tp": 1}, "does not match the world size 4"),
        (6, {"dp_replicate": -1, "tp": 4}, "not divisible"),
        (4, {"dp_replicate": -1, "dp_shard": -1}, "only one parallel degree"),
        (4, {"tp": 0}, "parallel.tp=0"),
    ],
)
def test_degrees_that_cannot_work_fail_with_hint(world, degrees, needle):
    with pytest.raises(ConfigError) as e:
        dims(world, **degrees)
    assert needle in str(e.value) and "HINT:" in str(e.value)


@pytest.mark.parametrize(
    "world, overrides, needle",
    [
        (2, ["--parallel.tp=2", "--parallel.dp_replicate=1", "--model.size=tiny"], None),  # 4 heads / 2: fine
        (
            3,
            ["--parallel.tp=3", "--parallel.dp_replicate=1"],
            "does not divide the model's attention heads (4)",
        ),
        (4, ["--parallel.pp=4", "--parallel.dp_replicate=1"], "4 pipeline stages"),  # tiny has 2 blocks
        (
            2,
            ["--parallel.pp=2", "--parallel.dp_replicate=1", "--parallel.pp_schedule=interleaved_1f1b"],
            "needs several stages per rank",
        ),
        (
            2,
            ["--parallel.pp=2", "--parallel.dp_replicate=1", "--parallel.pp_stages_per_rank=2"],
            "one stage per rank",
        ),
        (
            2,
            ["--parallel.pp=2", "--parallel.dp_replicate=1", "--parallel.pp_microbatches=3"],
            "does not divide",
        ),
        (
            2,
            ["--parallel.pp=2", "--parallel.dp_replicate=1", "--parallel.pp_schedule=zb"],
            "parallel.pp_schedule",
        ),
        (
            4,
            [
                "--parallel.pp=4",
                "--parallel.dp_replicate=1",
                "--parallel.pp_schedule=interleaved_1f1b",
                "--parallel.pp_stages_per_rank=2",
                "--model.n_layers=8",
                "--parallel.pp_microbatches=9",
                "--train.micro_batch_size=18",
                "--train.global_batch_size=18",
            ],
            "equal rounds",
        ),
        (
            2,
            [
                "--parallel.pp=2",
                "--parallel.dp_replicate=1",
                "--parallel.pp_schedule=interleaved_1f1b",
                "--parallel.pp_stages_per_rank=3",
                "--model.n_layers=4",
            ],
            "6 pipeline stages",
        ),
        (
            2,
            [
                "--parallel.pp=2",
                "--parallel.dp_replicate=1",
                "--parallel.pp_microbatches=1",
                "--model.n_layers=4",
            ],
            "leave ranks idle",
        ),
        (2, ["--parallel.pp=2", "--parallel.dp_replicate=1", "--parallel.pp_microbatches=-2"], "must be 0"),
        (2, ["--parallel.pp_stages_per_rank=2"], "need pipeline parallelism"),
        (2, ["--parallel.sequence_parallel=true"], "need tensor parallelism"),
        (2, ["--parallel.param_dtype=bf16"], "FSDP options"),
        (
            2,
            [
                "--parallel.tp=2",
                "--parallel.dp_replicate=1",
                "--parallel.sequence_parallel=true",
                "--data.seq_len=33",
            ],
            "not divisible by parallel.tp=2",
        ),
        (2, ["--parallel.activation_checkpoint=some"], "parallel.activation_checkpoint"),
        # width and head overrides of the named size: checked against each other and against the TP degree
        (2, ["--model.n_heads=3"], "width 128 (model.dim) is not divisible by its 3 attention heads"),
        (2, ["--model.dim=-96"], "model.dim must be 0"),
        (
            4,
            ["--model.dim=96", "--model.n_heads=6", "--parallel.tp=4", "--parallel.dp_replicate=1"],
            "does not divide the model's attention heads (6)",
        ),
        (2, ["--model.dim=96", "--model.n_heads=6", "--parallel.tp=2", "--parallel.dp_replicate=1"], None),
        (
            4,
            [
                "--parallel.dp_shard=2",
                "--parallel.dp_replicate=2",
                "--train.global_batch_size=24",
                "--train.micro_batch_size=8",
            ],
            "not divisible",
        ),
    ],
)
def test_preflight_checks_layout_against_model(world, overrides, needle):
    cfg = load_config(None, overrides)
    if needle is None:
        assert preflight(cfg, world).tp == 2
        return
    with pytest.raises(ConfigError) as e:
        preflight(cfg, world)
    assert needle in str(e.value) and "HINT:" in str(e.value)


def test_tp_and_pp_reduce_the_data_parallel_degree_for_batch_checks():
    # 8 ranks as pp 2 x tp 2 x dp 2: the global batch is split over 2 data-parallel ranks only
    cfg = load_config(
        None,
        [
            "--parallel.pp=2",
            "--parallel.tp=2",
            "--parallel.dp_replicate=2",
            "--model.n_layers=4",
            "--train.global_batch_size=16",
            "--train.micro_batch_size=8",
        ],
    )
    d = preflight(cfg, 8)
    assert d.dp == 2 and model_shape("tiny", 4).n_layers == 4
