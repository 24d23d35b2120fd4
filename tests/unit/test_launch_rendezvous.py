"""slurm.rendezvous: torchrun's rendezvous words by the job's torch; the words for torch 2.4 are parsed by
torch's own torchrun argument parser (2.13's: the static options it uses are the same in 2.4)."""

from __future__ import annotations

import shlex

import pytest

from exatrain.slurm.rendezvous import rendezvous_words


def test_no_suffix_is_the_c10d_rendezvous_without_local_addr():
    shared, per_node = rendezvous_words("")
    assert "--rdzv-backend=c10d" in shared and per_node == []


@pytest.mark.parametrize("version", [None, (2, 5), (2, 13)])
def test_suffix_makes_each_agent_advertise_its_suffixed_name(version):
    shared, per_node = rendezvous_words("i", version)
    assert '--rdzv-endpoint="$RDZV_HEAD"i:"$RDZV_PORT"' in shared
    assert per_node == ['--local-addr="$SLURMD_NODENAME"i']


def test_torch_2_4_gets_the_static_rendezvous_with_the_suffixed_master():
    shared, per_node = rendezvous_words("i", (2, 4))
    assert "--rdzv-backend=static" in shared and '--master-addr="$RDZV_HEAD"i' in shared
    assert per_node == ['--node-rank="$SLURM_NODEID"'] and not any("local-addr" in w for w in shared)


@pytest.mark.parametrize("version", [(2, 4), (2, 13)])
def test_torchrun_parses_the_words(version):
    torch_run = pytest.importorskip("torch.distributed.run")
    shared, per_node = rendezvous_words("i", version)
    values = {
        "$RDZV_HEAD": "jwb0001",
        "$RDZV_PORT": "29400",
        "$SLURM_JOB_ID": "7",
        "$SLURM_NNODES": "2",
        "$SLURMD_NODENAME": "jwb0002",
        "$SLURM_NODEID": "1",
    }
    text = " ".join(shared + per_node)
    for k, v in values.items():
        text = text.replace(f'"{k}"', v)
    args = torch_run.get_args_parser().parse_args([*shlex.split(text), "--nproc-per-node=1", "train.py"])
    if version >= (2, 5):
        assert (args.rdzv_endpoint, args.local_addr) == ("jwb0001i:29400", "jwb0002i")
    else:
        got = (args.rdzv_backend, args.master_addr, args.master_port, args.node_rank)
        assert got == ("static", "jwb0001i", 29400, 1)
