"""SLURM node lists and tasks-per-node strings, expanded in Python."""

import pytest

from exatrain.env import expand_nodelist, parse_tasks_per_node
from exatrain.errors import ClusterEnvError


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node[1-2]", ["node1", "node2"]),
        ("nid[005000-005003,005010]", ["nid005000", "nid005001", "nid005002", "nid005003", "nid005010"]),
        ("jwb[0001-0002],jwb0100", ["jwb0001", "jwb0002", "jwb0100"]),
        ("jrc[0001-0002]i", ["jrc0001i", "jrc0002i"]),
        ("gpu7", ["gpu7"]),
    ],
)
def test_expand_nodelist(text, hosts):
    assert expand_nodelist(text) == hosts


def test_expand_nodelist_keeps_slurm_order():
    assert expand_nodelist("node9,node[2-3],node1") == ["node9", "node2", "node3", "node1"]


@pytest.mark.parametrize("text", ["node[1-2", "node[3-1]", "", "   "])
def test_expand_nodelist_rejects_malformed(text):
    with pytest.raises(ClusterEnvError) as info:
        expand_nodelist(text, source="SLURM_STEP_NODELIST")
    assert "HINT:" in str(info.value)
    assert "SLURM_STEP_NODELIST" in str(info.value)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize(
    ("text", "counts"),
    [("4", [4]), ("2,1", [2, 1]), ("2(x3),1", [2, 2, 2, 1]), ("8(x2)", [8, 8]), ("1,3(x2),2", [1, 3, 3, 2])],
)
def test_parse_tasks_per_node(text, counts):
    assert parse_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "x", "2(x)", "2(3)", "0", "2(x0)", "2,,1", "-1", "2(x3"])
def test_parse_tasks_per_node_rejects_malformed(text):
    with pytest.raises(ClusterEnvError) as info:
        parse_tasks_per_node(text, source="SLURM_TASKS_PER_NODE")
    assert "HINT:" in str(info.value)
    assert "SLURM_TASKS_PER_NODE" in str(info.value)
