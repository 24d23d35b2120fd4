"""How torchrun's agents meet and which address their workers get: the rendezvous words of torchrun mode.

The workers' MASTER_ADDR is not what the batch script exports: torchrun's agent of node rank 0 publishes it
(torch/distributed/elastic/rendezvous/api.py, ``RendezvousStoreInfo.build``: ``local_addr or
socket.getfqdn()``), and every agent hands it to its workers. On JSC's machines the plain host name is the
management network; job traffic must use the InfiniBand name, the host name plus ``i`` (itwinai's JSC scripts:
"Allow communication over InfiniBand cells on JSC machines"; JSC's torchrun_jsc passes ``--local_addr`` for
this). So where a profile has a master suffix, each agent advertises its node's suffixed name:

- torch >= 2.5 (and where the job's torch is unknown): ``--local-addr=<node>i``, with the c10d rendezvous;
- torch 2.4 has no ``--local-addr`` (it came with torch 2.5; torchrun_jsc patches 2.4's
  ``RendezvousStoreInfo.build(rank, store)`` instead): the static rendezvous, whose workers are given the
  ``--master-addr`` it is started with, the first node's suffixed name. It is not elastic (a restart
  restarts every node's workers), which torchrun mode of `exatrain submit` does not rely on.

Never imports torch: the choice takes the job's torch version (learned on the compute node), not the login
node's.
"""

from __future__ import annotations

import shlex

LOCAL_ADDR_SINCE = (2, 5)  # first torch release whose torchrun has --local-addr


def rendezvous_words(
    suffix: str, torch_version: tuple[int, int] | None = None
) -> tuple[list[str], list[str]]:
    """torchrun's rendezvous options for the job's torch (None: unknown), as two lists of shell words: those
    the batch shell expands (``$RDZV_HEAD``, ``$RDZV_PORT``, ``$SLURM_JOB_ID``) and those each node's own
    shell expands (``$SLURMD_NODENAME``, ``$SLURM_NODEID``: they differ per node)."""
    quoted = shlex.quote(suffix) if suffix else ""
    if suffix and torch_version is not None and torch_version < LOCAL_ADDR_SINCE:
        return (
            [
                '--nnodes="$SLURM_NNODES"',
                "--rdzv-backend=static",
                f'--master-addr="$RDZV_HEAD"{quoted}',
                '--master-port="$RDZV_PORT"',
            ],
            ['--node-rank="$SLURM_NODEID"'],
        )
    shared = [
        '--nnodes="$SLURM_NNODES"',
        "--rdzv-backend=c10d",
        f'--rdzv-endpoint="$RDZV_HEAD"{quoted}:"$RDZV_PORT"',
        '--rdzv-id="$SLURM_JOB_ID"',
    ]
    # Each agent advertises its own node's suffixed name; node rank 0's becomes the workers' MASTER_ADDR.
    return shared, ([f'--local-addr="$SLURMD_NODENAME"{quoted}'] if suffix else [])
