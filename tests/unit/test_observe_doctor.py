"""The doctor's per-node checks and its reading of NCCL_DEBUG=INFO logs.

No GPU and no fabric here: the NCCL excerpts below are in the format NCCL and aws-ofi-nccl print (host
names and addresses changed); interfaces and plugins are looked up in a temporary /sys/class/net and
library directory."""

import pytest

from exatrain.observe import doctor

SOCKET_FALLBACK = """\
nid001:21:570 [0] NCCL INFO NET/OFI Using transport protocol SENDRECV
nid001:21:570 [0] nccl_net_ofi_create_plugin:257 NCCL WARN NET/OFI aws-ofi-nccl initialization failed
nid001:21:570 [0] NCCL INFO NET/IB : No device found.
nid001:21:570 [0] NCCL INFO NET/Socket : Using [0]eth0:10.1.2.3<0>
nid001:21:570 [0] NCCL INFO Using non-device net plugin version 0
nid001:21:570 [0] NCCL INFO Using network Socket
"""
OFI = """\
nid002:79:2499 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.14.2
nid002:79:2499 [0] NCCL INFO NET/OFI Using Libfabric version 2.1
nid002:79:2499 [0] NCCL INFO Using network Libfabric
"""
IB = """\
jwb0001:4242:4242 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.2.0.1<0>
jwb0001:4242:4242 [0] NCCL INFO Using network IB
"""


@pytest.mark.parametrize("log, network", [(SOCKET_FALLBACK, "Socket"), (OFI, "OFI"), (IB, "IB"),
                                          ("NCCL INFO NET/IB : Using [0]mlx5_0:1/IB\n", "IB"), ("", None)])
def test_nccl_network_from_the_log(log, network):
    assert doctor.parse_nccl_network(log) == network


def test_socket_between_nodes_fails_with_a_hint():
    reports = [{"rank": r, "host": f"nid00{r}", "device": "cuda:0", "visible_gpus": 1, "ranks_on_node": 1,
                "interfaces": ["hsn0"], "caches": {"/tmp": True}} for r in range(2)]
    assert doctor.failures(reports, "nccl", "OFI") == []
    [(problem, hint)] = doctor.failures(reports, "nccl", "Socket")
    assert "NET/Socket" in problem and "aws-ofi" in hint
    assert doctor.failures(reports, "gloo", "Socket") == []  # gloo always uses TCP


def test_gpu_visibility_and_caches_are_checked():
    base = {"rank": 3, "host": "n1", "device": "cuda:0", "ranks_on_node": 4, "interfaces": [], "caches": {}}
    assert doctor.failures([dict(base, visible_gpus=1)], "nccl", None) == []
    assert doctor.failures([dict(base, visible_gpus=4)], "nccl", None) == []
    [(problem, _)] = doctor.failures([dict(base, visible_gpus=2)], "nccl", None)
    assert problem == "rank 3 on n1: sees 2 GPU(s) with 4 rank(s) on the node"
    [(problem, hint)] = doctor.failures([dict(base, visible_gpus=1, caches={"/scratch": False})], "nccl", None)
    assert "/scratch is not writable" in problem and hint


def test_interfaces_plugins_and_sizes(tmp_path):
    net = tmp_path / "net"
    for name in ("lo", "eth0", "hsn0", "hsn1", "ib0"):
        (net / name).mkdir(parents=True)
    assert doctor.high_speed_interfaces(str(net)) == ["hsn0", "hsn1", "ib0"]
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libnccl-net-ofi.so").touch()
    (lib / "libc.so").touch()
    assert doctor.network_plugins(f"/nonexistent:{lib}") == [str(lib / "libnccl-net-ofi.so")]
    assert doctor.parse_size("256MiB") == 256 * 2**20 and doctor.parse_size("4096") == 4096
    assert doctor.sweep_sizes(2**20) == [1024, 4096, 16384, 65536, 262144, 1048576]
    assert doctor.writable(tmp_path) and not doctor.writable("/proc")
    with pytest.raises(ValueError, match="size '1TB'"):
        doctor.parse_size("1TB")
