"""Every host path the ranks of a containerised job read or write, so that the script binds each of them.

A container sees only what is bound. The ranks read the configuration file next to the run directory, the
corpus, the token cache, a checkpoint to start from and a profile file, and write the run directory; all of
them must be visible at the same path inside. Never imports torch.
"""

from __future__ import annotations

import os
from pathlib import Path

from exatrain.config import Config
from exatrain.slurm.profiles import is_profile_path


def rank_paths(cfg: Config, run_dir: Path, cwd: Path) -> tuple[str, ...]:
    """Absolute host paths the ranks use, beyond the run directory: its parent (the configuration file, the
    output files and the default token cache live there), the job's working directory (relative paths
    resolve against it), and data, cache, checkpoint and profile paths. A path that does not exist yet
    (a cache created by the ranks) is bound through its nearest existing ancestor."""
    paths = {run_dir.parent, cwd}
    for value in (
        cfg.data.path,
        cfg.data.cache_dir,
        cfg.checkpoint.init_from,
        _resume_path(cfg.checkpoint.resume),
        cfg.job.container_venv,
    ):
        if value:
            paths |= both_names(cwd / value)
    if is_profile_path(cfg.job.profile):
        paths |= both_names(cwd / cfg.job.profile)
    return tuple(sorted(str(p) for p in paths))


def both_names(path: Path) -> set[Path]:
    """The path by the name the ranks use and by its resolved name: a symlinked path (LUMI's
    /scratch/<project> is a link into /pfs/...) is bound by the name given, so that the configured name
    resolves inside the image, and by its target, for whatever refers to the resolved one."""
    given = existing_ancestor(Path(os.path.abspath(path)), resolve=False)
    return {given, existing_ancestor(path)}


def _resume_path(resume: str) -> str:
    return "" if resume in ("", "auto") else resume


def existing_ancestor(path: Path, resolve: bool = True) -> Path:
    """PATH, or its nearest ancestor that exists (a cache the ranks create is bound through its parent)."""
    path = path.resolve() if resolve else path
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path
