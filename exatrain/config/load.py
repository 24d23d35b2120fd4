"""The one place that reads TOML: a file plus `--section.key=value` overrides -> a checked `Config`."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

from exatrain.config.schema import Config
from exatrain.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_TYPES = {"str": str, "int": int, "float": float, "bool": bool}
_TYPE_NAMES = {
    "str | int": "str or int",
    "tuple[str, ...]": "list of str",
    "tuple[tuple[str, str], ...]": "table of str",
}


def sections() -> dict[str, type]:
    """Map section name -> its dataclass type."""
    return {f.name: f.default_factory().__class__ for f in dataclasses.fields(Config)}


def load_config(path: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Build the configuration from an optional TOML file and `--section.key=value` overrides.

    Overrides win over the file; unknown sections or keys and wrongly typed values raise ConfigError
    listing what is valid, before any work starts.
    """
    data: dict[str, dict[str, Any]] = read_toml(path) if path else {}
    for text in overrides:
        section, key, value = parse_override(text)
        data.setdefault(section, {})[key] = value
    return config_from_dict(data, source=path or "overrides")


def read_toml(path: str) -> dict[str, Any]:
    """Parse a TOML file (configs, site profiles), failing with a ConfigError that names it."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {path!r} does not exist", "pass an existing TOML file to --config")
    try:
        return tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(
            f"config file {path!r} is not valid TOML: {e}", "fix the TOML syntax at that line"
        ) from None


def parse_override(text: str) -> tuple[str, str, Any]:
    """Split `--section.key=value` into its parts; the value is read as a TOML literal, else as a string."""
    body = text[2:] if text.startswith("--") else text
    name, sep, raw = body.partition("=")
    section, dot, key = name.partition(".")
    if not sep or not dot or not section or not key:
        raise ConfigError(
            f"cannot read override {text!r}",
            "write overrides as --section.key=value, e.g. --train.steps=100 (sections: "
            + ", ".join(sections())
            + ")",
        )
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # bare words such as --model.size=small
    return section, key, value


def config_from_dict(data: dict[str, Any], source: str) -> Config:
    """Check parsed TOML tables (section -> key -> value) and build the Config; missing keys keep defaults."""
    known = sections()
    data = _renamed_sections(data, source)
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown config section(s) {', '.join(map(repr, unknown))} in {source}",
            "valid sections: " + ", ".join(known),
        )
    built = {}
    for name, cls in known.items():
        values = data.get(name, {})
        if not isinstance(values, dict):
            raise ConfigError(
                f"[{name}] in {source} must be a table", f"write it as [{name}] followed by key = value lines"
            )
        built[name] = _build_section(name, cls, values, source)
    return Config(**built)


#: old section name -> new one; the old name is still read, with a note, for one release
RENAMED_SECTIONS = {"profile": "profiler"}


def _renamed_sections(data: dict[str, Any], source: str) -> dict[str, Any]:
    """Accept a renamed section under its old name (its keys merged under the new one), with a note."""
    data = dict(data)
    for old, new in RENAMED_SECTIONS.items():
        if old in data:
            print(
                f"exatrain: note: config section [{old}] in {source} is now [{new}] (--{new}.KEY=VALUE); "
                f"the old name is accepted until the next release",
                file=sys.stderr,
            )
            values = data.pop(old)
            data[new] = {**values, **data.get(new, {})} if isinstance(values, dict) else values
    return data


def _build_section(name: str, cls: type, values: dict[str, Any], source: str):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(
                f"unknown config key {name}.{key} in {source}",
                f"valid keys of [{name}]: " + ", ".join(fields),
            )
        values[key] = _coerce(f"{name}.{key}", fields[key].type, value)
    return cls(**values)


def _coerce(key: str, type_name: str, value: Any) -> Any:
    if type_name in _COMPOUND:
        return _COMPOUND[type_name](key, value)
    expected = _TYPES[type_name]
    ok = isinstance(value, expected) and not (expected is not bool and isinstance(value, bool))
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        raise _wrong_type(key, type_name, value, f"--{key}={_example(type_name)}")
    return value


def _wrong_type(key: str, type_name: str, value: Any, example: str) -> ConfigError:
    return ConfigError(
        f"config key {key} must be {type_name}, got {value!r} ({type(value).__name__})",
        f"write {key} as {type_name}, e.g. {example}",
    )


def _str_or_int(key: str, value: Any) -> str:
    """Text, or a whole number kept as its text (job.time = 90 means 90 minutes)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _wrong_type(key, "str | int", value, f'--{key}="01:00:00" or --{key}=60')
    return str(value)


def _str_list(key: str, value: Any) -> tuple[str, ...]:
    """A TOML array of strings, stored as a tuple (frozen configs hold no lists)."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise _wrong_type(key, "a list of strings", value, f'--{key}=\'["a", "b"]\'')
    return tuple(value)


def _str_table(key: str, value: Any) -> tuple[tuple[str, str], ...]:
    """A TOML table of strings, stored as sorted (name, value) pairs (deterministic, hashable)."""
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise _wrong_type(
            key,
            "a table of strings",
            value,
            f'[{key}] with NAME = "value" lines (quote numbers too), or --{key}=\'{{NAME="value"}}\'',
        )
    return tuple(sorted((str(k), v) for k, v in value.items()))


_COMPOUND = {
    "str | int": _str_or_int,
    "tuple[str, ...]": _str_list,
    "tuple[tuple[str, str], ...]": _str_table,
}


def _example(type_name: str) -> str:
    return {"str": "name", "int": "10", "float": "0.5", "bool": "true"}[type_name]


def to_toml(cfg: Config) -> str:
    """Render a configuration as TOML (used to record the config a run used)."""
    lines = []
    for section in dataclasses.fields(cfg):
        lines.append(f"[{section.name}]")
        for f in dataclasses.fields(getattr(cfg, section.name)):
            value = getattr(getattr(cfg, section.name), f.name)
            lines.append(f"{f.name} = {_toml_value(value, f.type)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any, type_name: str = "") -> str:
    if type_name == "tuple[tuple[str, str], ...]":
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value) + "}"
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = value.replace("\\", "\\\\").replace('"', '\\"')
        # TOML basic strings hold no raw control characters: the value stays on one line
        return '"' + re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\u{ord(m.group()):04x}", text) + '"'
    return repr(value)


def reference() -> str:
    """The configuration reference as Markdown, generated from the field docs."""
    out = []
    for name, cls in sections().items():
        out.append(f"### `[{name}]`: {cls.__doc__.strip()}\n")
        out.append("| key | type | default | meaning |")
        out.append("|---|---|---|---|")
        for f in dataclasses.fields(cls):
            out.append(
                f"| `{f.name}` | {_TYPE_NAMES.get(f.type, f.type)} | `{_toml_value(f.default, f.type)}` | "
                f"{f.metadata['help']} |"
            )
        out.append("")
    return "\n".join(out)
