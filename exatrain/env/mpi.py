"""Processes started by ``mpirun``/``mpiexec`` (Open MPI, MPICH, Intel MPI or another PMI launcher)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from exatrain.env._read import check_at_most, check_below, first_set, require_int
from exatrain.env.base import LOOPBACK, ClusterEnvironment, Layout
from exatrain.errors import ClusterEnvError


class _Flavour(NamedTuple):
    rank: str
    size: str
    local_rank: str
    local_size: str


# OMPI_COMM_WORLD_NODE_RANK is NOT a node index: Open MPI documents it as "the relative rank of this
# process on this node looking across all jobs" (a per-node process rank), so the node rank is derived.
_FLAVOURS = (
    _Flavour(
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    _Flavour("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)
_WHY = "the MPI launcher sets it next to the rank"


def _flavour(environ: Mapping[str, str]) -> _Flavour | None:
    return next((f for f in _FLAVOURS if first_set(environ, f.rank) and first_set(environ, f.size)), None)


class MPIEnvironment(ClusterEnvironment):
    """Ranks from the MPI launcher's variables; the rendezvous address must come from MASTER_ADDR."""

    kind = "mpi"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """An MPI launcher set a world rank and size (Open MPI or PMI names)."""
        return _flavour(environ) is not None

    def _read_layout(self, environ: Mapping[str, str]) -> Layout:
        names = _flavour(environ) or _FLAVOURS[0]
        world = require_int(environ, names.size, why=_WHY, minimum=1)
        rank = require_int(environ, names.rank, why=_WHY)
        local_world = require_int(environ, names.local_size, why=_WHY, minimum=1)
        local_rank = require_int(environ, names.local_rank, why=_WHY)
        check_below(rank, names.rank, world, names.size)
        check_below(local_rank, names.local_rank, local_world, names.local_size)
        check_at_most(local_world, names.local_size, world, names.size)
        if local_world == world:  # every rank on this node
            return Layout(world, rank, local_rank, local_world, 0, 1)
        # MPI exports no node index (Open MPI's OMPI_COMM_WORLD_NODE_RANK is a per-node process rank), and
        # rank // local_size is wrong for --map-by node and for hosts with different slot counts: the node
        # layout stays unknown until the group exists and the ranks' host names give it (node_layout).
        return Layout(world, rank, local_rank, local_world, None, None)

    def _read_main_address(self, environ: Mapping[str, str], master_suffix: str) -> str:
        chosen = first_set(environ, "MASTER_ADDR")
        if chosen:
            return chosen[1]
        if self.world_size == 1:
            return LOOPBACK
        raise ClusterEnvError(
            "MASTER_ADDR is not set, and mpirun does not say which host rank 0 runs on "
            f"({self.world_size} ranks)",
            "export MASTER_ADDR=$(hostname) on the first node and pass it on (Open MPI: mpirun -x "
            "MASTER_ADDR; MPICH, Intel MPI: mpiexec -genv MASTER_ADDR $MASTER_ADDR), "
            "or launch with srun or torchrun, which exatrain reads without help",
        )
