"""Every bundled profile's script, in both launch modes, for whole and partial nodes, is accepted by a real
slurmctld whose nodes and partitions are shaped like the profile's site; a script that breaks a partition
limit is refused by it, and by exatrain before it (the profile's [[partitions]] table and the testbed's
partitions say the same).

Faked (testbed/sites.conf): the site nodes' hardware counts (cores, memory, GPUs are declared to slurmd and
believed through config_overrides on this 2-core machine) and their GPU device files. Real: slurmctld's own
checks of each request against those counts and the partitions' limits (EnforcePartLimits=ALL). Nothing runs
on the site nodes: every script goes through ``sbatch --test-only``, as `exatrain submit --test-only` sends
it.
"""

from __future__ import annotations

import dataclasses

import pytest

from exatrain.errors import ConfigError, ExatrainError
from exatrain.slurm.profiles import SiteProfile, bundled_profiles, load_profile
from exatrain.slurm.runner import SlurmRunner
from exatrain.slurm.sbatch import render_sbatch
from exatrain.slurm.spec import JobSpec
from exatrain.slurm.submit import Prepared, check_schedulable

pytestmark = pytest.mark.slurm

RUN_DIR = "/scratch/project/runs/exp"


@pytest.fixture(autouse=True)
def _site_nodes(slurm_cluster):
    if not slurm_cluster.site_nodes:
        pytest.skip("the testbed was started without its site-shaped nodes (STB_SITES=0)")


# Profiles without [[partitions]] name the site's default
# partition (""): the testbed's generic nodes stand in.
GENERIC = "generic"


def _partitions(profile: SiteProfile) -> list[tuple[str, str]]:
    """(partition, time limit) pairs to try: each partition the profile describes, at its own time limit."""
    if not profile.partitions:
        return [(GENERIC, "02:00:00")]
    return [(p.name, p.max_time or "02:00:00") for p in profile.partitions]


def _cases(profile: SiteProfile) -> list[dict]:
    """Full nodes (every GPU, or as many ranks as the cores allow on CPU nodes; 2 nodes) and a partial node
    (one GPU or rank on one node), in both launch modes, on every partition."""
    full = profile.gpus_per_node or profile.usable_cores // profile.default_cpus_per_gpu
    cases = []
    for partition, time in _partitions(profile):
        for launch in ("srun", "torchrun"):
            for nodes, ranks in ((2, full), (1, 1)):
                cases.append(
                    {
                        "nodes": nodes,
                        "gpus_per_node": ranks,
                        "time": time,
                        "launch": launch,
                        "partition": partition,
                        "profile": profile.name,
                    }
                )
    return cases


def _prepared(job: dict, profile: SiteProfile) -> Prepared:
    spec = JobSpec.from_dict(job)
    script = render_sbatch(spec, profile, RUN_DIR, (RUN_DIR + ".toml", "[train]\nsteps = 10\n"))
    return Prepared(spec, RUN_DIR, script, "", None)


@pytest.mark.parametrize("name", bundled_profiles())
def test_every_profile_script_is_accepted_by_its_site(slurm_cluster, name):
    profile = load_profile(name)
    runner = SlurmRunner(env=slurm_cluster.env, timeout_s=60)
    refused = []
    for job in _cases(profile):
        prepared = _prepared(job, profile)
        try:
            answer = check_schedulable(prepared, runner)
        except ExatrainError as e:
            refused.append(f"{job}: {e}\n{prepared.script}")
            continue
        assert f"in partition {job['partition']}" in answer, answer
    assert not refused, "slurmctld refused scripts exatrain generated:\n" + "\n\n".join(refused)


def _over(limit: str) -> str:
    """One minute more than a D-HH:MM:SS / HH:MM:SS limit."""
    days, _, clock = limit.rpartition("-")
    h, m, s = (int(x) for x in clock.split(":"))
    minutes = (int(days or 0) * 24 + h) * 60 + m + 1
    return f"{minutes // 1440}-{minutes % 1440 // 60:02d}:{minutes % 60:02d}:{s:02d}"


LIMITED = [(name, p.name) for name in bundled_profiles() for p in load_profile(name).partitions if p.max_time]


@pytest.mark.parametrize("name,partition", LIMITED)
def test_time_beyond_the_partition_limit_is_refused_by_exatrain_and_slurm(slurm_cluster, name, partition):
    """One minute over the partition's MaxTime: exatrain refuses it with a HINT; rendered without the
    profile's [[partitions]] table (so exatrain does not check), slurmctld refuses it too, with the reason
    exatrain translates into a HINT. (The same job at the limit is accepted: the test above.)"""
    profile = load_profile(name)
    limit = profile.partition_named(partition).max_time
    job = {"nodes": 1, "time": _over(limit), "partition": partition, "profile": name}
    with pytest.raises(ConfigError, match=f"exceeds the {limit} limit of partition"):
        JobSpec.from_dict(job).check_against(profile)
    unchecked = dataclasses.replace(profile, partitions=())
    with pytest.raises(ExatrainError) as refused:
        check_schedulable(_prepared(job, unchecked), SlurmRunner(env=slurm_cluster.env, timeout_s=60))
    assert "Requested time limit is invalid" in refused.value.message, refused.value.message
    assert "MaxTime" in refused.value.hint


def test_memory_beyond_a_lumi_node_is_refused(slurm_cluster):
    """8 GCDs x 61 GB = 488 GB > the 480 GB a LUMI-G job may have per node (60 GB per GCD is the limit)."""
    profile = load_profile("lumi-g")
    job = {"nodes": 1, "mem_per_gpu_gb": 61, "partition": "small-g", "profile": "lumi-g"}
    with pytest.raises(ConfigError, match="exceed the 480 GB"):
        JobSpec.from_dict(job).check_against(profile)
    with pytest.raises(ExatrainError):
        check_schedulable(
            _prepared(job, dataclasses.replace(profile, partitions=())),
            SlurmRunner(env=slurm_cluster.env, timeout_s=60),
        )
