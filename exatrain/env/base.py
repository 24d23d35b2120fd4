"""The common interface every launcher kind (torchrun, srun, mpirun, plain python) presents."""

from __future__ import annotations

import abc
import copy
import dataclasses
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from exatrain.env._read import first_set, read_restart_count, slurm_job_id
from exatrain.env.ports import check_port
from exatrain.errors import ClusterEnvError

DEFAULT_PORT = 29500
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Layout:
    """Where this process sits: ranks and sizes, already validated by the kind that read them."""

    world_size: int
    global_rank: int
    local_rank: int
    local_world_size: int
    node_rank: (
        int | None
    )  # None: the launcher does not say (MPI over several nodes); known once the group exists
    num_nodes: int | None


def node_layout(hosts: Sequence[str], rank: int) -> tuple[int, int]:
    """(node index, node count) of ``rank`` from every rank's host name, in rank order: nodes are numbered
    in the order their first rank appears, whatever the launcher's mapping (by slot, by node, uneven)."""
    order = list(dict.fromkeys(hosts))
    return order.index(hosts[rank]), len(order)


def resolve_host(host: str) -> str:
    """Resolve ``host`` to an IPv4 address so every rank connects to the same interface."""
    try:
        return socket.gethostbyname(host)
    except (OSError, UnicodeError) as exc:
        raise ClusterEnvError(
            f"cannot resolve the master host {host!r}: {exc}",
            "check the master suffix (JSC uses 'i' for the InfiniBand name) or set MASTER_ADDR to an address "
            "all nodes can reach; inside containers make sure /etc/hosts or DNS is available",
        ) from exc


class ClusterEnvironment(abc.ABC):
    """Ranks, sizes and rendezvous address of this process, read once from the environment and validated.

    Subclasses implement :meth:`detect` and the ``_read_*`` hooks; construction parses eagerly so that a
    broken environment fails at start-up with a :class:`ClusterEnvError` instead of hanging in rendezvous.
    The hooks run in this order, so later ones may use earlier results: ``_read_layout``, ``_read_job_id``,
    ``_read_notes``, ``_read_main_address``, then ``_default_port`` (only if no port was chosen).
    """

    kind: ClassVar[str]

    def __init__(
        self,
        environ: Mapping[str, str],
        master_suffix: str = "",
        resolve_master: bool = False,
        master_port: int | None = None,
    ):
        self._layout = self._read_layout(environ)
        self._job_id = self._read_job_id(environ)
        self._restart_count = read_restart_count(environ)
        self._notes = tuple(self._read_notes(environ))
        self._launcher_hosts_store = self._read_launcher_hosts_store(environ)
        address = self._read_main_address(environ, master_suffix)
        self._main_address = resolve_host(address) if resolve_master else address
        self._main_port = self._choose_port(environ, master_port)
        self._hostname = socket.gethostname()

    @classmethod
    @abc.abstractmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """Whether ``environ`` looks like a process started by this kind's launcher."""

    @abc.abstractmethod
    def _read_layout(self, environ: Mapping[str, str]) -> Layout:
        """Read and validate ranks and sizes."""

    @abc.abstractmethod
    def _read_main_address(self, environ: Mapping[str, str], master_suffix: str) -> str:
        """The host rank 0 listens on (before optional resolution)."""

    def _default_port(self, environ: Mapping[str, str]) -> int:
        """The port used when neither the caller nor MASTER_PORT chose one."""
        return DEFAULT_PORT

    def _read_job_id(self, environ: Mapping[str, str]) -> str | None:
        """The scheduler's job id, if any."""
        return slurm_job_id(environ)

    def _read_notes(self, environ: Mapping[str, str]) -> tuple[str, ...]:
        """Human-readable remarks about the environment (none by default)."""
        return ()

    def _read_launcher_hosts_store(self, environ: Mapping[str, str]) -> bool:
        """Whether the launcher already serves the rendezvous store at the master address (none does by
        default)."""
        return False

    def _choose_port(self, environ: Mapping[str, str], master_port: int | None) -> int:
        if master_port is not None:
            return check_port(master_port, "master_port")
        found = first_set(environ, "MASTER_PORT")
        return check_port(found[1], "MASTER_PORT") if found else self._default_port(environ)

    @property
    def world_size(self) -> int:
        """Number of processes in the job."""
        return self._layout.world_size

    @property
    def global_rank(self) -> int:
        """This process's rank in the job (0 .. world_size-1)."""
        return self._layout.global_rank

    @property
    def local_rank(self) -> int:
        """This process's rank among the processes on its node."""
        return self._layout.local_rank

    @property
    def local_world_size(self) -> int:
        """Number of processes on this node."""
        return self._layout.local_world_size

    @property
    def node_rank(self) -> int | None:
        """Index of this node among the job's nodes; None where the launcher does not say (see
        node_layout)."""
        return self._layout.node_rank

    @property
    def num_nodes(self) -> int | None:
        """Number of nodes in the job; None where the launcher does not say."""
        return self._layout.num_nodes

    @property
    def spans_nodes(self) -> bool:
        """Whether the job certainly runs on more than one node (also when the node count is unknown: more
        ranks in the job than on this node)."""
        return self.num_nodes > 1 if self.num_nodes is not None else self.world_size > self.local_world_size

    def with_node_layout(self, node_rank: int, num_nodes: int) -> ClusterEnvironment:
        """A copy that knows its node index and count (learnt from the host names of all ranks)."""
        other = copy.copy(self)
        other._layout = dataclasses.replace(self._layout, node_rank=node_rank, num_nodes=num_nodes)
        return other

    @property
    def main_address(self) -> str:
        """Host or IP that rank 0 listens on (MASTER_ADDR)."""
        return self._main_address

    @property
    def main_port(self) -> int:
        """Rendezvous port (MASTER_PORT)."""
        return self._main_port

    @property
    def hostname(self) -> str:
        """This machine's host name, for logs."""
        return self._hostname

    @property
    def job_id(self) -> str | None:
        """The scheduler's job id, or None outside a job."""
        return self._job_id

    @property
    def restart_count(self) -> int:
        """How often this job was restarted: by torchrun's elastic agent or by a SLURM requeue (0 = first
        run)."""
        return self._restart_count

    @property
    def notes(self) -> tuple[str, ...]:
        """Human-readable remarks, e.g. that this is a batch shell."""
        return self._notes

    @property
    def launcher_hosts_store(self) -> bool:
        """True when the launcher (torchrun's agent, sharing its store) serves the TCP store at
        main_address:main_port; otherwise rank 0 must host it there."""
        return self._launcher_hosts_store

    @property
    def is_distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1

    def to_dict(self) -> dict[str, Any]:
        """All properties as a JSON-able dict (for ``exatrain env`` and logs)."""
        names = (
            "kind",
            "world_size",
            "global_rank",
            "local_rank",
            "local_world_size",
            "node_rank",
            "num_nodes",
            "main_address",
            "main_port",
            "hostname",
            "job_id",
            "restart_count",
            "is_distributed",
        )
        return {**{name: getattr(self, name) for name in names}, "notes": list(self.notes)}

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(rank={self.global_rank}/{self.world_size}, "
            f"local={self.local_rank}/{self.local_world_size}, node={self.node_rank}/{self.num_nodes}, "
            f"main={self.main_address}:{self.main_port})"
        )
