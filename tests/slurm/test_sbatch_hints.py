"""sbatch's refusals, as the real slurmctld words them, turned into exatrain's HINTs: `exatrain submit`
(sbatch with the script file) and `exatrain submit --test-only` (the script on stdin) with a request the test
cluster refuses. Each time the same script is also given to sbatch directly, and exatrain's error must quote
the reason sbatch printed, and its HINT must name the job key to change.

"Invalid account": the testbed's slurmdbd does not enforce associations (no AccountingStorageEnforce), so
slurmctld checks accounts only against a partition's AllowAccounts; the test creates such a partition (`acct`,
project_465000123 only) and asks for another account, which slurmctld refuses with the same words as a site
that enforces associations ("Invalid account or account/partition combination specified").
"Invalid qos": with the testbed's slurmdbd (STB_ACCOUNTING=1; its QOS list holds "normal" only) slurmctld
checks a job's QOS against a partition's AllowQos; the test creates such a partition (`qos`, "normal" only)
and asks for another QOS, which slurmctld refuses with the words a site's controller uses for any QOS the job
may not have ("Invalid qos specification"). Checked on the testbed: without slurmdbd even AllowQos is not
checked, and without AccountingStorageEnforce=qos a QOS missing from the database is accepted in a
partition without AllowQos. Not reproduced: a QOS refused by the user's association (enforcing associations
would make every job of this suite need one)."""

import re

import pytest

from tests.slurm.test_submit import _exatrain, _job_toml

pytestmark = pytest.mark.slurm

# request -> the job key the HINT must name (what the user changes)
CASES = {
    "no such partition": (["--job.partition=nosuch"], "job.partition"),
    "more nodes than the partition": (["--job.nodes=99"], "job.nodes"),
    # dev-g: the LUMI-G-shaped partition, MaxTime 3 h (testbed/sites.conf); 240 minutes
    "time over the partition's MaxTime": (["--job.partition=dev-g", "--job.time=240"], "job.time"),
    "more memory than a node has": (["--job.mem_per_gpu_gb=999"], "job.mem_per_gpu_gb"),
    "an account the partition does not allow": (
        ["--job.partition=acct", "--job.account=nosuch"],
        "job.account",
    ),
    # needs the testbed's accounting (STB_ACCOUNTING=1, the fixture's default): its QOS list has "normal" only
    "a QOS the partition does not allow": (["--job.partition=qos", "--job.qos=nosuch"], "job.qos"),
}


@pytest.fixture(scope="module", autouse=True)
def restricted_partitions(slurm_cluster):
    """For this module, on the debug nodes: the partition `acct` that only project_465000123 may use, and
    the partition `qos` that allows only the QOS "normal"."""
    partitions = {"acct": "AllowAccounts=project_465000123", "qos": "AllowQos=normal"}
    for name, allow in partitions.items():
        create = ["scontrol", "create", f"PartitionName={name}", "Nodes=node[1-2]", allow]
        slurm_cluster.run(create, check=True)
    yield
    for name in partitions:
        slurm_cluster.run(["scontrol", "delete", f"PartitionName={name}"])


def _sbatch_reason(cluster, args: list[str], script, cwd) -> str:
    """What sbatch itself says about the script exatrain wrote: its first line, without "sbatch: error: "."""
    r = cluster.run(["sbatch", *args, str(script)], cwd=cwd)
    if r.returncode == 0:
        cluster.run(["scancel", r.stdout.strip().split(";")[0]])
        raise AssertionError(f"sbatch {args} accepted it: {r.stdout}{r.stderr}")
    # its first line: "sbatch: error: ..." or, from --test-only, "allocation failure: ..."
    return re.sub(r"^sbatch: error: ", "", r.stderr.splitlines()[0].strip())


@pytest.mark.parametrize("case", list(CASES))
def test_real_sbatch_refusal_gets_its_hint(slurm_cluster, tmp_path, case):
    overrides, key = CASES[case]
    config = _job_toml(tmp_path)
    run = tmp_path / "run"
    for mode, verb, sbatch_args in (
        ([], "submit", ["--parsable"]),
        (["--test-only"], "schedule", ["--test-only"]),
    ):
        r = _exatrain(
            slurm_cluster, "submit", "-c", str(config), *mode, *overrides, f"--run.dir={run}", cwd=tmp_path
        )
        assert r.returncode == 2, r.stdout + r.stderr
        assert "Traceback" not in r.stderr
        reason = _sbatch_reason(
            slurm_cluster, sbatch_args, tmp_path / "run.sbatch", tmp_path
        )  # submit wrote it
        assert f"exatrain: error: SLURM would not {verb} the job: {reason}" in r.stderr, (reason, r.stderr)
        hint = r.stderr.split("HINT: ", 1)[1]
        assert key in hint, (case, hint)
