"""Site profiles and job specs: bundled files load, user files load, bad input fails with a HINT."""

import subprocess
import sys
from pathlib import Path

import pytest

from exatrain.errors import ConfigError
from exatrain.slurm import JobSpec, bundled_profiles, load_profile
from exatrain.slurm.profiles import PROFILE_DIR
from tests.unit.lumi_gcd import gcd_mask

EXPECTED = ["cpu", "generic-amd", "generic-nvidia", "jureca-dc", "juwels-booster", "lumi-g"]


@pytest.mark.parametrize("name", EXPECTED)
def test_bundled_profile_loads(name):
    profile = load_profile(name)
    assert profile.name == name
    assert profile.billing


def test_bundled_list():
    assert bundled_profiles() == EXPECTED


def test_lumi_values():
    p = load_profile("lumi-g")
    assert [int(m, 16) for m in p.cpu_masks] == [gcd_mask(g) for g in range(8)]  # from the GCD-to-CCD table
    env = dict(p.comm_env)
    assert env["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3"
    rccl = dict(p.presets[-1].env)  # the generation without a container (and before ROCm 7)
    assert rccl["FI_CXI_DEFAULT_TX_SIZE"] == "2048" and rccl["HSA_FORCE_FINE_GRAIN_PCIE"] == "1"
    assert {"MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR", "TRITON_CACHE_DIR"} <= dict(p.caches).keys()
    assert load_profile("juwels-booster").master_suffix == "i"


def test_user_path_profile(tmp_path):
    text = (
        (PROFILE_DIR / "generic-nvidia.toml")
        .read_text()
        .replace('name = "generic-nvidia"', 'name = "mysite"')
    )
    path = tmp_path / "mysite.toml"
    path.write_text(text.replace("gpus_per_node = 4", "gpus_per_node = 2"))
    profile = load_profile(str(path))
    assert (profile.name, profile.gpus_per_node) == ("mysite", 2)


def test_unknown_key_rejected(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("gpu_count = 3\n" + (PROFILE_DIR / "cpu.toml").read_text())
    with pytest.raises(ConfigError, match="unknown key") as exc:
        load_profile(str(path))
    assert "HINT: valid keys:" in str(exc.value) and "gpus_per_node" in exc.value.hint
    # appended at the end, TOML puts the key into the last [[billing]] table: rejected there too
    path.write_text((PROFILE_DIR / "cpu.toml").read_text() + "\ngpu_count = 3\n")
    with pytest.raises(ConfigError, match="unknown key.*billing rule") as exc:
        load_profile(str(path))
    assert "units_per_gpu_hour" in exc.value.hint


def test_unknown_profile_name():
    with pytest.raises(ConfigError, match="unknown site profile") as exc:
        load_profile("lumi")
    assert "lumi-g" in exc.value.hint


def test_bad_mask_count(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text((PROFILE_DIR / "lumi-g.toml").read_text().replace('"0xfe", "0xfe00",', ""))
    with pytest.raises(ConfigError, match="cpu_masks has 6 entries for 8 GPUs"):
        load_profile(str(path))


def test_spec_from_dict_and_errors():
    spec = JobSpec.from_dict(
        {"nodes": 2, "time": 90, "env": {"B": "2", "A": "1"}, "command": ["python", "x.py"]}
    )
    assert spec.slurm_time() == "01:30:00" and spec.env == (("A", "1"), ("B", "2"))
    with pytest.raises(ConfigError, match="unknown config key job.node") as exc:
        JobSpec.from_dict({"node": 2})
    assert "nodes" in exc.value.hint
    with pytest.raises(ConfigError, match="must be int"):
        JobSpec.from_dict({"nodes": "2"})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(nodes=0), "at least 1"),
        (dict(launch="mpirun"), "not a launch mode"),
        (dict(time="1:5:5:5"), "not a SLURM time"),
        (dict(time="0"), "not a time"),
        (dict(signal="USR2"), "SIG@SECONDS"),
        (dict(extra_sbatch=("-N2",)), "long flag"),
    ],
)
def test_spec_value_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match) as exc:
        JobSpec(**kwargs)
    assert "HINT:" in str(exc.value)


def test_launch_never_imports_torch():
    code = (
        "import sys, exatrain.launch, exatrain.slurm.spec, exatrain.slurm.profiles, exatrain.slurm.sbatch, "
        "exatrain.slurm.billing, exatrain.launch.local, exatrain.slurm.runner, exatrain.slurm.submit, "
        "exatrain.slurm.sweep, exatrain.env.affinity, exatrain.env.master_check; "
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]; print(bad); "
        "sys.exit(bool(bad))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[2]
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["sbatch", "--job.profile=lumi-g"],
        ["cost", "--job.profile=cpu"],
        ["submit", "--dry-run", "--job.profile=cpu", "--run.dir=/tmp/x"],
    ],
)
def test_cli_job_paths_never_import_torch(argv):
    """What a login node runs stays instant: no torch on these paths (timings: benchmarks/cli_startup.py)."""
    code = (
        "import runpy, sys; sys.argv = ['exatrain', *sys.argv[1:]]\n"
        "try:\n    runpy.run_module('exatrain.cli.main', run_name='__main__')\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]\n"
        "print(bad, file=sys.stderr); sys.exit(bool(bad))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=Path(__file__).parents[2]
    )
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize(
    ("name", "limits", "over", "cores"),
    [
        ("juwels-booster", {"booster": "24:00:00", "develbooster": "02:00:00"}, ("24:01:00", "02:01:00"), 48),
        ("jureca-dc", {"dc-gpu": "24:00:00", "dc-gpu-devel": "02:00:00"}, ("24:01:00", "02:01:00"), 128),
    ],
)
def test_jsc_partitions_carry_time_limits_only(name, limits, over, cores):
    """The README's JSC caveat, exactly: each partition has a time limit (24 h production, 2 h development),
    which is checked, and no node or memory limit, so none is checked (a 5000-node job with 2 TB per node
    passes); billing is whole nodes in core-hours at the node's core count (2 x EPYC 7402: 48, 2 x EPYC
    7742: 128)."""
    p = load_profile(name)
    assert {part.name: part.max_time for part in p.partitions} == limits
    assert [(part.max_nodes, part.mem_per_node_gb) for part in p.partitions] == [(0, 0)] * len(limits)
    for (part, limit), too_long in zip(limits.items(), over):
        JobSpec(nodes=5000, partition=part, time=limit, mem_per_gpu_gb=500).check_against(p)
        with pytest.raises(ConfigError, match=f"exceeds the {limit} limit of partition '{part}'"):
            JobSpec(partition=part, time=too_long).check_against(p)
    assert p.cores_per_node == cores
    assert [(b.rule, b.partitions, b.units_per_node_hour, b.unit) for b in p.billing] == [
        ("whole-node", (), float(cores), "core-hours")
    ]
