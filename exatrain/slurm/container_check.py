"""`exatrain submit`'s check of a container job on the login node, before anything is queued: the user's
bind paths exist, the job's venv exists, and the image's environment (started as the ranks start it,
activation included) imports torch and exatrain. Never imports torch (the image's Python does)."""

from __future__ import annotations

import os

from exatrain.errors import ExatrainError
from exatrain.slurm.container_env import check_binds, check_image, fix_command
from exatrain.slurm.profiles import load_profile


def check_job(prepared, run_image: bool = True) -> str:
    """Check the container of a prepared job; returns the line to print (versions), or a note when the
    image was not started (RUN_IMAGE false: a dry run where the runtime is missing)."""
    spec = prepared.spec
    profile = load_profile(spec.profile)
    check_binds(spec.container_binds)
    here = tuple(
        b
        for b in (*spec.container_binds, *prepared.binds, *profile.container_binds)
        if os.path.exists(b.split(":")[0])
    )  # the profile's node-only paths (slurmd's spool) may be absent here
    binds = tuple(dict.fromkeys(here))
    if spec.container_venv and not os.path.isdir(spec.container_venv):
        raise ExatrainError(
            f"job.container_venv {spec.container_venv} does not exist",
            "create it once through the image: "
            + fix_command(profile.container_runtime, spec.container_image, spec.container_venv),
        )
    if not run_image:
        return (
            f"container: {profile.container_runtime} not found here: the image {spec.container_image} was "
            "not checked (exatrain submit checks it where the runtime works)"
        )
    torch_version, version = check_image(
        profile.container_runtime, spec.container_image, spec.container_start, spec.container_venv, binds
    )
    venv = f" (venv {spec.container_venv})" if spec.container_venv else ""
    return f"container: {spec.container_image}: torch {torch_version}, exatrain {version}{venv}"
