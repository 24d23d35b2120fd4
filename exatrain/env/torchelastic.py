"""Processes started by ``torchrun`` (torch.distributed.elastic), possibly inside a SLURM job."""

from __future__ import annotations

import os
from collections.abc import Mapping

from exatrain.env._read import check_at_most, check_below, first_set, parse_int, require, require_int
from exatrain.env.base import ClusterEnvironment, Layout
from exatrain.env.ports import check_port

_WHY = "torchrun always sets it"


class TorchElasticEnvironment(ClusterEnvironment):
    """Ranks and rendezvous exactly as torchrun assigned them (RANK, LOCAL_RANK, GROUP_RANK, MASTER_*)."""

    kind = "torchelastic"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """torchrun sets TORCHELASTIC_RUN_ID next to the rank variables in every worker."""
        return all(
            first_set(environ, name) for name in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK")
        )

    def _read_layout(self, environ: Mapping[str, str]) -> Layout:
        world = require_int(environ, "WORLD_SIZE", why=_WHY, minimum=1)
        rank = require_int(environ, "RANK", why=_WHY)
        local_world = require_int(environ, "LOCAL_WORLD_SIZE", why=_WHY, minimum=1)
        local_rank = require_int(environ, "LOCAL_RANK", why=_WHY)
        node_rank = require_int(environ, "GROUP_RANK", why=_WHY)
        nodes_var = first_set(environ, "GROUP_WORLD_SIZE")
        num_nodes = parse_int(nodes_var[1], "GROUP_WORLD_SIZE", 1) if nodes_var else world // local_world
        check_below(rank, "RANK", world, "WORLD_SIZE")
        check_below(local_rank, "LOCAL_RANK", local_world, "LOCAL_WORLD_SIZE")
        check_at_most(local_world, "LOCAL_WORLD_SIZE", world, "WORLD_SIZE")
        check_below(node_rank, "GROUP_RANK", num_nodes, "GROUP_WORLD_SIZE or WORLD_SIZE/LOCAL_WORLD_SIZE")
        return Layout(world, rank, local_rank, local_world, node_rank, num_nodes)

    def _read_notes(self, environ: Mapping[str, str]) -> tuple[str, ...]:
        # torch 2.13 keeps the agent's shared store across restarts without a per-attempt prefix, so a
        # restarted group can read the dead group's addresses (pytorch/pytorch#135712).
        restarts = parse_int(
            environ.get("TORCHELASTIC_MAX_RESTARTS", "").strip() or "0", "TORCHELASTIC_MAX_RESTARTS", 0
        )
        if restarts > 0 and environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            return (
                "torchrun may restart these workers, but its agent shares its store with them: a "
                "restarted group "
                "can fail to connect; export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 before torchrun "
                "(`exatrain train --nproc N --max-restarts K` does)",
            )
        return ()

    def _read_launcher_hosts_store(self, environ: Mapping[str, str]) -> bool:
        # The agent shares its store with the workers unless TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (which
        # `exatrain train --max-restarts` sets); then rank 0 hosts the group's store at MASTER_PORT.
        return environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"

    def _read_main_address(self, environ: Mapping[str, str], master_suffix: str) -> str:
        # torchrun's own store listens here; a derived address would point elsewhere, so no suffix is added.
        return require(environ, "MASTER_ADDR", why=_WHY)[1]

    def _default_port(self, environ: Mapping[str, str]) -> int:
        # Only reached when MASTER_PORT is unset, which torchrun never leaves it: report that.
        name, value = require(environ, "MASTER_PORT", why=_WHY)
        return check_port(value, name)


def worker_error_file(environ: Mapping[str, str] | None = None) -> str | None:
    """The error file torchrun's agent gives each worker (``TORCHELASTIC_ERROR_FILE``, read by the agent when
    the worker fails: what torch's ``@record`` writes), else None."""
    found = first_set(os.environ if environ is None else environ, "TORCHELASTIC_ERROR_FILE")
    return found[1] if found else None


def rank_label(environ: Mapping[str, str] | None = None) -> str:
    """``[rank N] `` for the RANK this process was given (by torchrun, or by `exatrain run` under
    srun/mpirun), ``[rank ?] `` without one: what `exatrain run --label` begins each line with."""
    found = first_set(os.environ if environ is None else environ, "RANK")
    return f"[rank {found[1] if found else '?'}] "
