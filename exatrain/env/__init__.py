"""Cluster environment: who launched this process, its ranks, and where to rendezvous.

The only layer that reads cluster environment variables. Standard library plus ``hostlist`` only:
importing it must stay cheap and must not pull in torch or numpy.
"""

from exatrain.env.base import ClusterEnvironment
from exatrain.env.detect import ORDER, detect_environment
from exatrain.env.hostlist import expand_nodelist, parse_tasks_per_node
from exatrain.env.local import LocalEnvironment
from exatrain.env.mpi import MPIEnvironment
from exatrain.env.ports import check_port, derive_port
from exatrain.env.slurm import SlurmEnvironment
from exatrain.env.torchelastic import TorchElasticEnvironment

__all__ = [
    "ORDER",
    "ClusterEnvironment",
    "LocalEnvironment",
    "MPIEnvironment",
    "SlurmEnvironment",
    "TorchElasticEnvironment",
    "check_port",
    "derive_port",
    "detect_environment",
    "expand_nodelist",
    "parse_tasks_per_node",
]
