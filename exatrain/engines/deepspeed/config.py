"""The DeepSpeed JSON config of `[engine] name = "deepspeed"`: generated from [train] and [engine], merged
with a user's own DeepSpeed JSON, whose keys may add to it but never contradict it.

Pure data (no torch, no deepspeed import): the engine passes the result to `deepspeed.initialize`.
"""

from __future__ import annotations

import json
from pathlib import Path

from exatrain.config.schema import Config
from exatrain.errors import ConfigError

#: DeepSpeed keys that exatrain's own configuration decides, and the exatrain key that sets each
OWNED = {
    "train_batch_size": "train.global_batch_size",
    "train_micro_batch_size_per_gpu": "train.micro_batch_size",
    "gradient_accumulation_steps": "train.global_batch_size / (train.micro_batch_size x ranks)",
    "gradient_clipping": "train.grad_clip",
    "zero_optimization.stage": "engine.zero_stage",
    "bf16.enabled": "train.precision",
    "fp16.enabled": "train.precision (exatrain trains in bf16 or fp32, never fp16)",
    "checkpoint.load_universal": "checkpoint.resume (a resume at another world size loads DeepSpeed's "
    "universal "
    "checkpoint by itself)",
}
#: sections a user's JSON may not have: exatrain builds the optimizer and schedule from [train]
FORBIDDEN = {
    "optimizer": "train.lr, train.beta1, train.beta2, train.weight_decay",
    "scheduler": "train.warmup_steps, train.min_lr_ratio",
}


def generated_config(cfg: Config, dp_size: int, bf16: bool) -> dict:
    """The DeepSpeed config that trains exactly like exatrain's torch engine with the same [train] keys."""
    t = cfg.train
    accum = t.global_batch_size // (t.micro_batch_size * dp_size)
    if cfg.engine.zero_stage not in (1, 2, 3):
        raise ConfigError(
            f"engine.zero_stage={cfg.engine.zero_stage} is not 1, 2 or 3", "use --engine.zero_stage=2"
        )
    if accum < 1 or accum * t.micro_batch_size * dp_size != t.global_batch_size:
        raise ConfigError(
            f"train.global_batch_size={t.global_batch_size} is not a multiple of train.micro_batch_size="
            f"{t.micro_batch_size} x {dp_size} ranks",
            f"use --train.global_batch_size={max(1, accum) * t.micro_batch_size * dp_size}",
        )
    return {
        "train_batch_size": t.global_batch_size,
        "train_micro_batch_size_per_gpu": t.micro_batch_size,
        "gradient_accumulation_steps": accum,
        "gradient_clipping": float(t.grad_clip),
        "zero_optimization": {"stage": cfg.engine.zero_stage},
        "bf16": {"enabled": bool(bf16)},
        "fp16": {"enabled": False},
        # exatrain turns it on for the one load of a universal checkpoint (engines/deepspeed/universal.py)
        "checkpoint": {"load_universal": False},
        # exatrain's AdamW (torch.optim) under ZeRO: DeepSpeed lists only its own optimizers as tested
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,  # exatrain reports progress itself
        "wall_clock_breakdown": False,
    }


def deepspeed_config(cfg: Config, dp_size: int, bf16: bool | None) -> dict:
    """The generated config, merged with `engine.deepspeed_config` (if set) after checking it.

    `bf16=None` (precision not known yet: auto before the device is) checks every key but the precision."""
    config = generated_config(cfg, dp_size, bool(bf16))
    if not cfg.engine.deepspeed_config:
        return config
    user = read_user_config(cfg.engine.deepspeed_config)
    check_user_config(user, config, cfg.engine.deepspeed_config, check_precision=bf16 is not None)
    return merge(config, user)


def read_user_config(path: str) -> dict:
    """A user's DeepSpeed JSON file as a dict; a clear error when it is missing or not a JSON object."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(
            f"engine.deepspeed_config={path!r}: no such file",
            "give the path of a DeepSpeed JSON file, or '' for none",
        )
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"engine.deepspeed_config={path!r} is not valid JSON: {exc}",
            "fix the file (DeepSpeed configs are JSON)",
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"engine.deepspeed_config={path!r} holds a JSON {type(data).__name__}, not an object",
            "a DeepSpeed config is one JSON object of keys",
        )
    return data


def check_user_config(user: dict, generated: dict, source: str, check_precision: bool = True) -> None:
    """Refuse keys of the user's JSON that contradict exatrain's settings, naming each and the exatrain key to
    use.

    DeepSpeed's "auto" is accepted for owned keys (it means "whatever the trainer decides")."""
    problems = [
        f"{key} (exatrain's optimizer and schedule come from {keys})"
        for key, keys in FORBIDDEN.items()
        if key in user
    ]
    for dotted, owner in OWNED.items():
        if not check_precision and dotted in ("bf16.enabled", "fp16.enabled"):
            continue
        found, value = _lookup(user, dotted)
        _, expected = _lookup(generated, dotted)
        if found and value != "auto" and value != expected:
            problems.append(f"{dotted}={value!r} but exatrain's setting gives {expected!r} (set by {owner})")
    if problems:
        raise ConfigError(
            f"engine.deepspeed_config={source!r} contradicts exatrain's configuration: "
            + "; ".join(problems),
            "remove " + ", ".join(p.split("=")[0].split(" ")[0] for p in problems) + " from the JSON "
            "(exatrain sets them from its own keys, named above), or change those exatrain keys",
        )


def merge(base: dict, extra: dict) -> dict:
    """`extra` over `base`, recursively for nested sections; "auto" values keep the base's."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        elif value != "auto" or key not in out:
            out[key] = value
    return out


def _lookup(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node
