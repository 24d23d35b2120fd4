"""The scheduler tests/conftest.py hands pytest-xdist, and the two facts its docstring gives for not using a
public option instead: each file is one unit of work, all of tests/slurm one unit; `--dist loadgroup`'s
group suffix does not reach pytest 9.2's node ids. When xdist or pytest change either, these fail and the
conftest can move to the public option."""

import copy

from xdist.scheduler import LoadScopeScheduling, loadscope
from xdist.workermanage import Producer

from tests.conftest import pytest_xdist_make_scheduler

IDS = [
    "tests/slurm/test_scale.py::test_scale_over_nodes",
    "tests/slurm/test_sites.py::test_memory_beyond_a_lumi_node_is_refused",
    "tests/unit/test_a.py::test_one[x@y]",
    "tests/unit/test_a.py::Group::test_two",
    "tests/e2e/test_b.py::test_three",
]


def test_each_file_and_all_of_tests_slurm_are_one_unit(pytestconfig, monkeypatch):
    # two workers, as scripts/test.sh's -n 2 (this process may run without xdist)
    monkeypatch.setattr(loadscope, "parse_tx_spec_config", lambda config: ["popen", "popen"])
    scheduler = pytest_xdist_make_scheduler(pytestconfig, Producer("test"))
    assert isinstance(scheduler, LoadScopeScheduling)
    assert [scheduler._split_scope(nodeid) for nodeid in IDS] == [
        "tests/slurm",
        "tests/slurm",
        "tests/unit/test_a.py",
        "tests/unit/test_a.py",
        "tests/e2e/test_b.py",
    ]


def test_loadgroup_suffix_does_not_reach_the_node_id(request):
    """What xdist 3.8's worker does for `--dist loadgroup` (xdist/remote.py: `item._nodeid = nodeid@group`),
    on a copy of this test's item: under pytest 9.2 the node id stays as it was."""
    item = copy.copy(request.node)
    before = item.nodeid
    item._nodeid = f"{item.nodeid}@slurm"
    assert item.nodeid == before
