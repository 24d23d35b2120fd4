"""env.nics: which of GLOO_SOCKET_IFNAME's interfaces a node has (a fake /sys/class/net); the error for
none."""

from __future__ import annotations

import subprocess
import sys

import pytest

from exatrain.env.nics import gloo_interfaces, node_interfaces, present_interfaces
from exatrain.errors import ClusterEnvError


def _root(tmp_path, *names):
    net = tmp_path / "sys" / "class" / "net"
    net.mkdir(parents=True)
    for name in names:
        (net / name).mkdir()
    return str(tmp_path)


def test_node_interfaces_lists_sys_class_net(tmp_path):
    assert node_interfaces(_root(tmp_path, "lo", "ib0", "eth0")) == {"lo", "ib0", "eth0"}
    assert node_interfaces(str(tmp_path / "nowhere")) == set()


def test_present_interfaces_keeps_list_order():
    assert present_interfaces("hsn3, hsn0,hsn9", {"hsn0", "hsn3"}) == (["hsn3", "hsn0"], ["hsn9"])


def test_gloo_list_is_narrowed_to_the_nodes_interfaces(tmp_path):
    root = _root(tmp_path, "lo", "eth0", "ib0")
    assert gloo_interfaces({"GLOO_SOCKET_IFNAME": "ib0,ib1,ib2,ib3"}, "jwb0001", root) == "ib0"
    assert gloo_interfaces({"GLOO_SOCKET_IFNAME": "ib0"}, "jwb0001", root) is None  # nothing to change
    assert gloo_interfaces({}, "jwb0001", root) is None


def test_no_listed_interface_on_the_node_names_them_and_the_node(tmp_path):
    root = _root(tmp_path, "lo", "eth0")
    with pytest.raises(ClusterEnvError) as e:
        gloo_interfaces({"GLOO_SOCKET_IFNAME": "hsn0,hsn1"}, "gen1", root)
    text = str(e.value)
    assert "GLOO_SOCKET_IFNAME=hsn0,hsn1" in text and "node gen1" in text and "it has: eth0" in text
    assert "\nHINT: " in text


def test_module_prints_the_value_or_fails_with_a_hint():
    """`python3 -m exatrain.env.nics` on this machine: lo exists everywhere, no-such-nic nowhere."""

    def run(value):
        return subprocess.run(
            [sys.executable, "-m", "exatrain.env.nics"],
            capture_output=True,
            text=True,
            env={"GLOO_SOCKET_IFNAME": value, "PATH": "/usr/bin:/bin"},
            timeout=30,
        )

    ok = run("no-such-nic,lo")
    assert (ok.returncode, ok.stdout.strip()) == (0, "lo"), ok.stderr
    bad = run("no-such-nic")
    assert bad.returncode == 1 and "no-such-nic" in bad.stderr and "HINT:" in bad.stderr
