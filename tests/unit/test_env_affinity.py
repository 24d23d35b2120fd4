"""Affinity expectations from masks and a FAKE sysfs tree (this machine has no GPUs and one NUMA node, so the
GPU/NUMA files are written by the test); the real-process check under taskset is in
tests/e2e/test_affinity.py."""

import os

import pytest

from exatrain.env.affinity import (
    check_rank,
    expected_cores,
    format_ranges,
    format_table,
    gpu_numa_nodes,
    mask_to_cores,
    parse_cpulist,
    physical_gpu,
)
from exatrain.slurm import load_profile
from exatrain.slurm.profiles import PROFILE_DIR
from tests.unit.lumi_gcd import gcd_cores, gcd_mask


def test_lumi_masks_are_the_gcd_ccds():
    """Every GCD's mask in the lumi-g profile is its CCD's cores minus the reserved first core, derived from
    the seed's GCD-to-CCD wiring (tests/unit/lumi_gcd.py), as cores and as the hex srun reads."""
    masks = load_profile("lumi-g").cpu_masks
    assert len(masks) == 8
    for gcd, mask in enumerate(masks):
        assert mask_to_cores(mask) == gcd_cores(gcd), f"GCD {gcd}"
        assert int(mask, 16) == gcd_mask(gcd), f"GCD {gcd}"
    assert (
        format_ranges(gcd_cores(0)) == "49-55" and format_ranges(gcd_cores(4)) == "1-7"
    )  # the seed's own words


def test_cpulist_round_trip():
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert format_ranges({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11" and format_ranges(None) == "-"


def _fake_sysfs(root):
    """Two NUMA nodes (0-3, 4-7); NVIDIA GPUs on buses 0000:81 (node 1) and 0000:01 (node 0)."""
    for node, cpus in ((0, "0-3"), (1, "4-7")):
        d = root / f"sys/devices/system/node/node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
    for bus, node in (("0000:81:00.0", 1), ("0000:01:00.0", 0)):
        (root / "proc/driver/nvidia/gpus" / bus).mkdir(parents=True)
        (root / "sys/bus/pci/devices" / bus).mkdir(parents=True)
        (root / "sys/bus/pci/devices" / bus / "numa_node").write_text(f"{node}\n")


def test_gpu_numa_from_sysfs(tmp_path):
    _fake_sysfs(tmp_path)
    assert gpu_numa_nodes(str(tmp_path)) == [0, 1]  # PCI bus order: 01 before 81
    assert expected_cores(1, 0, (), str(tmp_path)) == ({4, 5, 6, 7}, "numa")
    ok = check_rank(3, "n1", 1, 1, (), actual={5, 6}, root=str(tmp_path))
    assert (ok.gpu, ok.expected, ok.actual, ok.verdict) == ("cuda:1", "4-7", "5-6", "ok")
    bad = check_rank(3, "n1", 1, 1, (), actual={0, 5}, root=str(tmp_path))
    assert bad.mismatch and "cores 0 are off the GPU's NUMA node" in bad.verdict


def test_profile_mask_off_the_gpus_numa_node_is_reported(tmp_path):
    _fake_sysfs(tmp_path)  # GPU 1 sits on NUMA node 1 = cores 4-7
    good = check_rank(0, "n", 1, 0, ("0x1", "0x30"), actual={4, 5}, root=str(tmp_path))
    assert good.verdict == "ok"
    wrong = check_rank(
        0, "n", 1, 0, ("0x1", "0x6"), actual={1, 2}, root=str(tmp_path)
    )  # bound as the mask says
    assert wrong.verdict == "MISMATCH: profile mask cores 1-2 are off the GPU's NUMA node"


def test_amd_kfd_topology(tmp_path):
    props = tmp_path / "sys/class/kfd/kfd/topology/nodes"
    (props / "0").mkdir(parents=True)
    (props / "0/properties").write_text("cpu_cores_count 64\ngpu_id 0\n")  # the CPU node
    (props / "1").mkdir()
    (props / "1/properties").write_text("gpu_id 1234\ndomain 0\nlocation_id 49408\n")  # 0xc100: bus c1
    (tmp_path / "sys/bus/pci/devices/0000:c1:00.0").mkdir(parents=True)
    (tmp_path / "sys/bus/pci/devices/0000:c1:00.0/numa_node").write_text("3\n")
    assert gpu_numa_nodes(str(tmp_path)) == [3]


def test_mask_wins_and_must_match_exactly(tmp_path):
    masks = ("0x3", "0xc")
    assert check_rank(0, "n", None, 1, masks, actual={2, 3}).verdict == "ok"
    r = check_rank(0, "n", None, 1, masks, actual={1, 2})
    assert r.verdict == "MISMATCH: lacks 3, also on 1 (profile mask)"
    assert check_rank(0, "n", None, 2, masks, actual={0}).verdict == "unchecked"  # no mask for local rank 2


def test_physical_gpu_follows_visibility():
    assert physical_gpu(0, {"CUDA_VISIBLE_DEVICES": "2"}) == 2
    assert physical_gpu(1, {"ROCR_VISIBLE_DEVICES": "4,5"}) == 5
    assert physical_gpu(1, {}) == 1


def test_table_and_real_affinity():
    me = check_rank(0, "host", None, 0, ())  # this process's real affinity
    assert me.actual == format_ranges(os.sched_getaffinity(0)) and me.verdict == "unchecked"
    table = format_table([me, check_rank(1, "host", None, 0, ("0x1",), actual={1})]).splitlines()
    assert table[0].split() == ["rank", "host", "GPU", "expected", "cores", "actual", "cores", "verdict"]
    assert table[2].split()[:5] == ["1", "host", "cpu", "0", "1"] and "MISMATCH" in table[2]


@pytest.mark.parametrize("masks", [["0x1", "0x2", "0x4"], ["0x1"]])
def test_cpu_profile_may_list_masks_per_local_rank(tmp_path, masks):
    text = (PROFILE_DIR / "cpu.toml").read_text()
    path = tmp_path / "p.toml"
    path.write_text(text.replace("cpu_masks = []", f"cpu_masks = {masks!r}".replace("'", '"')))
    assert load_profile(str(path)).cpu_masks == tuple(masks)
