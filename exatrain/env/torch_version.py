"""Which torch the job has, learned where the ranks run, without importing it.

exatrain accepts a range of torch releases (pyproject.toml: ``torch>=2.4,<3``); sites ship their own
(LUMI's containers 2.2-2.9, JSC's modules similar). What torchrun accepts depends on that release, so the
version is read on the compute node, inside the container, from the installed package's metadata
(``importlib.metadata``: no torch import, milliseconds), never on the login node. Standard library only.
"""

from __future__ import annotations

import re
from importlib import metadata

from exatrain.errors import ConfigError

#: The oldest torch exatrain supports: the floor of pyproject.toml's ``torch>=2.4`` (a unit test keeps the two
#: equal). torchrun's options exatrain needs (c10d rendezvous, ``--rdzv-conf=is_host``, ``--local-addr``,
#: ``--no-python``) are all in 2.4's ``torch.distributed.run``.
TORCH_FLOOR = (2, 4)

#: The oldest torch exatrain's reference trainer (`exatrain train`) imports today: its checkpoint manager
#: stages async checkpoints with torch.distributed.checkpoint.staging.DefaultStager (in the 2.9.1 wheel, not
#: in 2.8.0's), besides the public DTensor (an empty torch.distributed.tensor in 2.4) and fully_shard.
#: Launching, `exatrain run` and `exatrain submit` need only TORCH_FLOOR (docs/torch-versions.md).
TRAINER_FLOOR = (2, 9)

_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_torch_version(text: str) -> tuple[int, int, int]:
    """``"2.4.0+rocm6.1"``, ``"2.9.0a0+gitabc"``, ``"2.10"`` -> ``(major, minor, patch)``; the local and
    pre-release parts are dropped (a site's own build of 2.9 has 2.9's torchrun)."""
    m = _RELEASE.match(text.strip())
    if not m:
        raise ValueError(f"not a torch version: {text!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def torch_version() -> tuple[int, int, int] | None:
    """The installed torch's version from its package metadata (the torch this interpreter would import),
    or None where no torch distribution is installed."""
    try:
        return parse_torch_version(metadata.version("torch"))
    except metadata.PackageNotFoundError:
        return None


def torch_at_least(version: tuple[int, ...], release: tuple[int, ...]) -> bool:
    """Whether ``version`` is ``release`` or newer (``torch_at_least((2, 9, 1), (2, 10))`` is False)."""
    return tuple(version) >= tuple(release)


def format_version(version: tuple[int, ...]) -> str:
    """``(2, 4, 0)`` -> ``"2.4.0"``."""
    return ".".join(str(part) for part in version)


def check_torch_floor(
    version: tuple[int, int, int] | None, python: str = "python", trainer: bool = False
) -> tuple[int, int, int]:
    """The job's torch version, or a ConfigError (with a HINT naming the version and the floor) where torch is
    missing or older than TORCH_FLOOR (``trainer``: TRAINER_FLOOR): the job stops at start, in seconds, before
    any rendezvous."""
    if trainer and version is not None and not torch_at_least(version, TRAINER_FLOOR):
        need = format_version(TRAINER_FLOOR)
        raise ConfigError(
            f"torch {format_version(version)} (of {python}) is older than {need}, the oldest torch "
            "exatrain's reference trainer imports (async checkpoint staging, DTensor, fully_shard)",
            f"use torch>={need} for `exatrain train`, or run your own training script with "
            f"`exatrain run` (torch>={format_version(TORCH_FLOOR)} is enough there)",
        )
    floor = format_version(TORCH_FLOOR)
    if version is None:
        raise ConfigError(
            f"no torch is installed for {python}, which starts the ranks",
            f"install torch>={floor} into that environment (or activate the environment or container "
            "that has it) before the job starts",
        )
    if not torch_at_least(version, TORCH_FLOOR):
        raise ConfigError(
            f"torch {format_version(version)} (of {python}) is older than exatrain's floor {floor}",
            f"use torch>={floor} (pyproject.toml: torch>={floor},<3): a newer container or module, "
            f"or pip install 'torch>={floor}' into the job's environment",
        )
    return version
