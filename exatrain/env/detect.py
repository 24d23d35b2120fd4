"""Picking the environment kind that launched this process."""

from __future__ import annotations

import os
from collections.abc import Mapping

from exatrain.env.base import ClusterEnvironment
from exatrain.env.local import LocalEnvironment
from exatrain.env.mpi import MPIEnvironment
from exatrain.env.slurm import SlurmEnvironment
from exatrain.env.torchelastic import TorchElasticEnvironment

# torchrun inside `srun` inherits the step's SLURM_* variables, but it starts several workers per task
# and assigns their ranks itself: the SLURM variables then describe the srun task, not the worker, so
# torchelastic must be tried first. LocalEnvironment always detects and therefore comes last.
ORDER: tuple[type[ClusterEnvironment], ...] = (
    TorchElasticEnvironment,
    SlurmEnvironment,
    MPIEnvironment,
    LocalEnvironment,
)


def detect_environment(
    environ: Mapping[str, str] | None = None,
    *,
    master_suffix: str = "",
    resolve_master: bool = False,
    master_port: int | None = None,
) -> ClusterEnvironment:
    """Return the first kind in :data:`ORDER` that recognises ``environ`` (default: ``os.environ``).

    ``master_suffix`` is appended to a derived master host name (JSC: ``"i"`` for InfiniBand),
    ``resolve_master`` turns it into an IP, ``master_port`` overrides MASTER_PORT and the derived port.
    Raises :class:`~exatrain.errors.ClusterEnvError` when the detected kind's variables are inconsistent.
    """
    environ = os.environ if environ is None else environ
    kind = next(kind for kind in ORDER if kind.detect(environ))
    return kind(environ, master_suffix=master_suffix, resolve_master=resolve_master, master_port=master_port)
