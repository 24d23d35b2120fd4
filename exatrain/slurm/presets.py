"""Communication presets that depend on the job, not only on the site. Never imports torch.

- ``[[presets]]`` groups of a profile: environment for one container generation, picked by the job's
  ``container_image`` (shell-style patterns; ``""`` stands for a job without a container). The first group
  that matches applies. LUMI documents different RCCL settings for its ROCm 6 and ROCm 7 images.
- ``[multi_node_env]``: exported only in jobs of more than one node (``NCCL_NET`` pins the network plugin,
  which is not initialised on one node).
- ``[container_env]``: exported only in jobs with a container, as the site's container bindings module sets
  it (LUMI's lumi-aif-singularity-bindings: ``SLURM_MPI_TYPE=pmi2``).
- ``--network=disable_rdzv_get`` is derived, never configured: it is rendered exactly when the job's
  environment asks libfabric's CXI provider for the ``alt_read`` rendezvous protocol, which needs the NIC's
  rendezvous GET disabled for the job (libfabric fi_cxi(7); HPE's RCCL guide).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from exatrain.errors import ConfigError

ALT_READ = ("FI_CXI_RDZV_PROTO", "alt_read")
NETWORK_FLAG = "--network"
DISABLE_RDZV_GET = "disable_rdzv_get"
_PRESET_KEYS = ("name", "images", "env", "source")
_MULTI_NODE_ONLY = ("NCCL_NET",)  # pinning a network plugin that one node never initialises fails the job


@dataclass(frozen=True)
class Preset:
    """One [[presets]] group: environment for the container generation its ``images`` patterns describe."""

    name: str
    images: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    source: str = ""

    def matches(self, image: str) -> bool:
        """Whether a job with this ``container_image`` ("" = no container) belongs to this generation."""
        return any(fnmatchcase(image, p) if p else not image for p in self.images)


def preset_for(image: str, presets: tuple[Preset, ...]) -> Preset | None:
    """The first [[presets]] group that matches the job's container image (None: no group applies)."""
    return next((p for p in presets if p.matches(image)), None)


def job_env(
    comm_env, presets, multi_node_env, image: str, nodes: int, container_env=()
) -> list[tuple[str, str]]:
    """Every preset a job exports, in order: the site's [comm_env], its generation's [[presets]] env, on more
    than one node [multi_node_env], and in a container job [container_env] (later ones win, as in the
    script)."""
    preset = preset_for(image, presets)
    env = dict(comm_env)
    env.update(preset.env if preset else ())
    env.update(multi_node_env if nodes > 1 else ())
    env.update(container_env if image else ())
    return list(env.items())


def network_flag(env: dict[str, str], extra_sbatch: tuple[str, ...]) -> str:
    """``--network=disable_rdzv_get`` where the job's environment selects alt_read, else "" (both or neither).

    A ``--network`` of the user's (job.extra_sbatch) that already disables rendezvous GET is kept as it is;
    one that does not would replace ours or be replaced by it (sbatch keeps one), so it is refused."""
    if env.get(ALT_READ[0]) != ALT_READ[1]:
        return ""
    own = [f for f in extra_sbatch if f.split("=", 1)[0] == NETWORK_FLAG]
    if not own:
        return f"{NETWORK_FLAG}={DISABLE_RDZV_GET}"
    if any(DISABLE_RDZV_GET in f.split("=", 1)[-1].split(",") for f in own):
        return ""
    raise ConfigError(
        f"job.extra_sbatch entry {own[0]!r} drops the {NETWORK_FLAG}={DISABLE_RDZV_GET} that "
        f"{ALT_READ[0]}={ALT_READ[1]} needs (libfabric's CXI provider requires rendezvous GET "
        "disabled for the job)",
        f"add it to your value: {own[0]},{DISABLE_RDZV_GET}; or set job.env "
        f'{ALT_READ[0]} = "default" to use the default protocol',
    )


def parse_presets(data: Any, source: str, env_table) -> tuple[Preset, ...]:
    """The profile's [[presets]] tables, checked; ``env_table(table, key, where)`` reads a string table."""
    if data is None:
        return ()
    if not isinstance(data, list) or not all(isinstance(t, dict) for t in data):
        raise ConfigError(
            f"{source}: presets must be a list of [[presets]] tables",
            'write [[presets]] tables with name, images = ["pattern", ...] and [presets.env]',
        )
    return tuple(_preset(t, f"{source} [[presets]] #{i + 1}", env_table) for i, t in enumerate(data))


def _preset(table: dict[str, Any], where: str, env_table) -> Preset:
    unknown = sorted(set(table) - set(_PRESET_KEYS))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}",
            f"valid keys: {', '.join(_PRESET_KEYS)}",
        )
    name, images = table.get("name"), table.get("images")
    if not isinstance(name, str) or not name:
        raise ConfigError(
            f"{where}: name must be a non-empty string",
            'name the container generation, e.g. name = "LUMI AI Factory images, ROCm 7"',
        )
    if not isinstance(images, list) or not images or not all(isinstance(p, str) for p in images):
        raise ConfigError(
            f"{where} ({name}): images must be a non-empty list of patterns, got {images!r}",
            "list shell-style patterns of image paths, e.g. "
            'images = ["/appl/local/laifs/containers/*"]'
            '; "" stands for a job without a container, "*" for any image',
        )
    source = table.get("source", "")
    if not isinstance(source, str):
        raise ConfigError(f"{where}: source must be a string", "write where the settings come from (a URL)")
    env = env_table(table, "env", where)
    check_single_node_safe(env, f"{where} [presets.env]")
    return Preset(name, tuple(images), env, source)


def check_single_node_safe(env: tuple[tuple[str, str], ...], where: str) -> None:
    """NCCL_NET belongs in [multi_node_env]: exported on one node, the plugin it pins is not initialised there
    and RCCL/NCCL stop with "network not found"."""
    for name in _MULTI_NODE_ONLY:
        if name in dict(env):
            raise ConfigError(
                f"{where} sets {name}, which would also be exported in one-node jobs",
                f"move {name} to [multi_node_env]: exatrain exports it only where a job has "
                "more than one node (one node never initialises the network plugin)",
            )
