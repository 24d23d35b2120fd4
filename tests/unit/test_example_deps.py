"""The examples' extra keeps the installed torch: torchvision is the release built for it, transformers does
not depend on torch at all (checked on the installed packages' own metadata, as pip reads it)."""

import re
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _requirements(package: str) -> list[str]:
    """Requires-Dist of an installed package, without spaces or parentheses: 'torch==2.13.0; extra == ...'."""
    return [re.sub(r"[\s()]", "", r) for r in metadata.requires(package) or []]


def test_torchvision_requires_exactly_the_installed_torch():
    torch_release = metadata.version("torch").split("+")[0]  # 2.13.0+cpu -> 2.13.0
    torch_pins = [r for r in _requirements("torchvision") if re.match(r"torch\W", r)]
    assert torch_pins == [f"torch=={torch_release}"]


def test_transformers_needs_torch_only_through_its_extras():
    torch_reqs = [r for r in _requirements("transformers") if re.match(r"torch\W", r)]
    assert torch_reqs and all("extra==" in r for r in torch_reqs)


def test_the_extra_pins_the_installed_releases():
    text = (ROOT / "pyproject.toml").read_text()
    extra = re.search(r"^examples = \[(.*)\]$", text, re.M).group(1)
    assert f'"torchvision=={metadata.version("torchvision").split("+")[0]}"' in extra
    assert f'"transformers=={metadata.version("transformers")}"' in extra
