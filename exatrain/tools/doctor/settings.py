"""What `exatrain doctor` takes from the job's config (`-c FILE` and `--section.key=value` overrides, read as
`exatrain train` reads them): the hang settings it reports, each from its flag when given, else from the
config, else the default, with where it came from, so that a user sees which of the three a job will run
with (docs/hangs.md); and the model shapes its matmul and attention probes time."""

from __future__ import annotations

from dataclasses import dataclass

from exatrain.config import load_config, parse_override, read_toml
from exatrain.config.validate import MIN_HANG_TIMEOUT_S
from exatrain.errors import ConfigError


@dataclass(frozen=True)
class Setting:
    """One timeout and its origin: `value` in seconds, "auto" (derived from the steps) or 0 (off)."""

    value: float | str
    source: str


@dataclass(frozen=True)
class HangSettings:
    """The collective timeout ([dist] timeout_s) and the hang watcher's timeout ([run] hang_timeout_s)."""

    collective: Setting
    watcher: Setting

    def sources_line(self) -> str:
        """One line saying where each setting came from (printed under the doctor's hang settings line)."""
        return (
            f"hang settings from: collective timeout: {self.collective.source}; "
            f"hang watcher: {self.watcher.source}"
        )


def hang_settings(config: str | None, overrides: list[str], collective_flag, watcher_flag) -> HangSettings:
    """The settings that apply: a flag (not None) wins over the config, the config over the defaults.

    Bad input (a missing or unparsable file, an unknown key, a timeout no job accepts) raises ConfigError
    naming the file or override and the key, before the doctor starts anything."""
    cfg = _config(config, overrides)
    origin = _origins(config, overrides)
    collective = _setting(
        ("dist", "timeout_s"), cfg.dist.timeout_s, origin, "--collective-timeout", collective_flag
    )
    watcher = _setting(
        ("run", "hang_timeout_s"), cfg.run.hang_timeout_s, origin, "--hang-timeout", watcher_flag
    )
    _check_collective(collective)
    return HangSettings(collective, Setting(_watcher_value(watcher), watcher.source))


@dataclass(frozen=True)
class JobShape:
    """The shapes of the job's model that the doctor's rate probes time (from its config)."""

    seq_len: int
    head_dim: int
    dim: int
    hidden: int  # the MLP's width
    n_layers: int
    vocab: int
    tokens: int  # per micro-batch on one rank: train.micro_batch_size x data.seq_len
    dropout: float = 0.0  # model.dropout: the attention kernel drops out inside (and runs slower for it)


def job_shape(config: str | None, overrides: list[str]) -> JobShape | None:
    """The job's model shapes, for the matmul and attention probes; None when neither a config file nor a
    [model], [data] or [train] override is given (the probes' defaults apply)."""
    if not config and not any(parse_override(o)[0] in ("model", "data", "train") for o in overrides):
        return None
    from exatrain.models import configured_shape
    from exatrain.tools.plan.planner import default_vocab

    cfg = _config(config, overrides)
    shape = configured_shape(cfg.model)
    return JobShape(
        seq_len=cfg.data.seq_len,
        head_dim=shape.dim // shape.n_heads,
        dim=shape.dim,
        hidden=shape.mlp_ratio * shape.dim,
        n_layers=shape.n_layers,
        vocab=default_vocab(cfg)[0],
        tokens=cfg.train.micro_batch_size * cfg.data.seq_len,
        dropout=cfg.model.dropout,
    )


def _config(config: str | None, overrides: list[str]):
    """The job's config; an error of the file alone names the file (the loader names only the key)."""
    if config:
        try:
            load_config(config)
        except ConfigError as e:
            if config in e.message:
                raise
            raise ConfigError(f"config file {config!r}: {e.message}", e.hint) from None
    return load_config(config, overrides)


def _origins(config: str | None, overrides: list[str]) -> dict[tuple[str, str], str]:
    """(section, key) -> where its value was set: the last override naming it, else the config file."""
    origin = {}
    if config:
        for section, values in read_toml(config).items():
            for key in values if isinstance(values, dict) else ():
                origin[(section, key)] = f"config file {config}"
    for text in overrides:
        section, key, _ = parse_override(text)
        origin[(section, key)] = f"override {text}"
    return origin


def _setting(key: tuple[str, str], value: float, origin: dict, flag: str, flag_value) -> Setting:
    """The flag's value when given, else the config's; the source names the flag, file/override or default."""
    section, name = key
    where = origin.get(key, "default")
    configured = where if where.startswith("override") else f"{where} ([{section}] {name} = {value:g})"
    if flag_value is None:
        return Setting(value, configured)
    shown = flag_value if isinstance(flag_value, str) else f"{flag_value:g}"
    over = "" if where == "default" else f", over {configured}"
    return Setting(flag_value, f"flag {flag} {shown}{over}")


def _named(setting: Setting) -> str:
    """The setting as an error names it: the flag alone when a flag set it, else the file or override."""
    return setting.source.split(", over ")[0]


def _check_collective(setting: Setting) -> None:
    setting_named = _named(setting)
    if not setting.value > 0:
        raise ConfigError(
            f"{setting_named}: a collective timeout must be positive (seconds)",
            "set [dist] timeout_s (or --collective-timeout) to seconds above the longest collective, "
            "e.g. 300",
        )


def _watcher_value(setting: Setting) -> float | str:
    """The watcher's timeout as the doctor reports it: "auto", 0 (off) or seconds of at least 2.

    The config's -1 means "derived from the steps" (auto); a flag says auto itself."""
    value, setting_named = setting.value, _named(setting)
    if value == "auto" or value == 0:
        return value
    if setting.source.startswith("flag") and value < 0:
        raise ConfigError(
            f"{setting_named}: a hang timeout is seconds (at least 2), 0 (off) or auto",
            "use auto for a timeout derived from the first steps, 0 for none, or seconds (e.g. 300)",
        )
    if value == -1:
        return "auto"
    if value < 0:
        raise ConfigError(
            f"{setting_named}: negative, but not -1 (derived from the steps)",
            "use -1 for a timeout derived from the first steps, 0 for none, or seconds (e.g. 300)",
        )
    if value < MIN_HANG_TIMEOUT_S:
        raise ConfigError(
            f"{setting_named}: a hang timeout must be at least {MIN_HANG_TIMEOUT_S:g} s",
            "choose well above your longest step, checkpoint and evaluation (e.g. 300)",
        )
    return float(value)
