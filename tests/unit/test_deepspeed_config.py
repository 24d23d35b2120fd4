"""The DeepSpeed JSON of [engine] name = "deepspeed": generated from [train]/[engine], a user's JSON merged
after checking it (each contradicting key named with the exatrain key that sets it), and preflight refusing
layouts DeepSpeed cannot combine with."""

import json

import pytest

from exatrain.config import load_config
from exatrain.engines.deepspeed.config import deepspeed_config, generated_config
from exatrain.errors import ConfigError
from exatrain.train.preflight import preflight


def _cfg(tmp_path, user: dict | None = None, *extra):
    args = [
        "--engine.name=deepspeed",
        "--engine.zero_stage=3",
        "--train.global_batch_size=32",
        "--train.micro_batch_size=4",
        "--train.grad_clip=0.5",
        *extra,
    ]
    if user is not None:
        (tmp_path / "ds.json").write_text(json.dumps(user))
        args.append(f"--engine.deepspeed_config={tmp_path / 'ds.json'}")
    return load_config(None, args)


def test_generated_from_train_keys(tmp_path):
    c = generated_config(_cfg(tmp_path), dp_size=2, bf16=True)
    assert (c["train_batch_size"], c["train_micro_batch_size_per_gpu"], c["gradient_accumulation_steps"]) == (
        32,
        4,
        4,
    )
    assert (c["gradient_clipping"], c["zero_optimization"], c["bf16"]["enabled"]) == (0.5, {"stage": 3}, True)


def test_user_json_adds_keys_and_auto_keeps_exatrains(tmp_path):
    user = {
        "zero_optimization": {"stage": 3, "overlap_comm": True},
        "train_batch_size": "auto",
        "gradient_clipping": 0.5,
    }
    c = deepspeed_config(_cfg(tmp_path, user), dp_size=2, bf16=False)
    assert c["zero_optimization"] == {"stage": 3, "overlap_comm": True}
    assert c["train_batch_size"] == 32 and c["gradient_clipping"] == 0.5


@pytest.mark.parametrize(
    "user, named",
    [
        (
            {"train_batch_size": 64},
            "train_batch_size=64 but exatrain's setting gives 32 (set by train.global_batch_size)",
        ),
        ({"gradient_accumulation_steps": 1}, "gradient_accumulation_steps=1"),
        (
            {"zero_optimization": {"stage": 1}},
            "zero_optimization.stage=1 but exatrain's setting gives 3 (set by engine.zero_stage)",
        ),
        ({"optimizer": {"type": "Adam"}}, "optimizer (exatrain's optimizer and schedule come from train.lr"),
        ({"fp16": {"enabled": True}}, "fp16.enabled=True"),
        (
            {"checkpoint": {"load_universal": True}},
            "checkpoint.load_universal=True but exatrain's setting gives False",
        ),
    ],
)
def test_contradicting_user_key_is_named_with_a_hint(tmp_path, user, named):
    with pytest.raises(ConfigError) as e:
        deepspeed_config(_cfg(tmp_path, user), dp_size=2, bf16=False)
    assert named in str(e.value) and "HINT: remove " in str(e.value)


def test_bad_user_file(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    for path, words in (
        (tmp_path / "missing.json", "no such file"),
        (tmp_path / "bad.json", "not valid JSON"),
    ):
        with pytest.raises(ConfigError, match=words):
            deepspeed_config(
                load_config(None, ["--engine.name=deepspeed", f"--engine.deepspeed_config={path}"]), 2, False
            )


def test_preflight_checks_engine_before_any_rank_starts(tmp_path):
    with pytest.raises(ConfigError, match="train_batch_size=64"):
        preflight(_cfg(tmp_path, {"train_batch_size": 64}), 2)
    with pytest.raises(ConfigError, match="shards by itself"):
        preflight(_cfg(tmp_path, None, "--parallel.dp_shard=2"), 2)
    with pytest.raises(ConfigError, match="engine.name='zero'"):
        preflight(load_config(None, ["--engine.name=zero"]), 1)
    preflight(
        _cfg(tmp_path, {"bf16": {"enabled": True}}), 2
    )  # precision auto: not known before the device is
