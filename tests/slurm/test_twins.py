"""Site twins (testbed/up.sh step 4b, docs/sites/twins.md): the LUMI-G, JUWELS Booster and generic nodes of
the test cluster each run their slurmd, and so every job step, in a network namespace of their own with the
site's interfaces, addresses and host names. A user's gloo script (twin_probe.py) submitted with `exatrain
submit` runs on two nodes of each twin in both launch modes; each rank reports the addresses of its own TCP
connections, so the tests check the network gloo and the store really used. The old renderings fail there as
on the sites.

Real: slurmctld/slurmd, network namespaces, veth pairs and bridges, gloo's interface lookup and connections,
torchrun's rendezvous and the address its agent publishes, /etc/hosts resolution. Not reproduced: the fabrics
themselves (Slingshot/InfiniBand are Linux bridges: no RDMA, no NCCL/RCCL, no libfabric), the sites' real
address plans, and why JSC's management network is off limits for job traffic (the twin refuses it outright,
with nftables in the JSC twins' namespaces; SLURM's own ports stay open).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from exatrain.slurm.rendezvous import rendezvous_words
from tests.slurm.test_submit import ROOT, _exatrain

pytestmark = pytest.mark.slurm

PROBE = Path(__file__).resolve().parent / "twin_probe.py"
# partition -> the twin nodes and the interfaces each has besides lo
TWINS = {
    "small-g": (["nid005001", "nid005002"], {"nmn0", "hsn0", "hsn1", "hsn2", "hsn3"}),
    "booster": (["jwb0001", "jwb0002"], {"eth0", "ib0"}),
    "generic": (["gen1", "gen2"], {"eth0"}),
}
# twin -> (profile, partition, the network gloo's connections must use, the store's, extra [job.env] lines)
SITES = {
    "lumi-g": ("lumi-g", "small-g", "10.78.", "10.77.", ""),
    # c227ac3's value: gloo failed on ib1; each rank now keeps the interfaces its node has (ib0)
    "juwels-booster": (
        "juwels-booster",
        "booster",
        "10.79.",
        "10.79.",
        'GLOO_SOCKET_IFNAME = "ib0,ib1,ib2,ib3"',
    ),
    "generic": ("generic-nvidia", "generic", "10.77.", "10.77.", ""),
}
JOB = """[job]
nodes = 2
gpus_per_node = 1
time = 10
profile = "{profile}"
partition = "{partition}"
launch = "{launch}"
command = ["python", "{probe}", "{out}", "60"]
[job.env]
OMP_NUM_THREADS = "1"
{extra}
"""


def _path_env() -> dict[str, str]:
    return {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}


@pytest.fixture(autouse=True)
def _twins(slurm_cluster):
    if not set(slurm_cluster.site_nodes) >= {n for nodes, _ in TWINS.values() for n in nodes}:
        pytest.skip("the testbed was started without its site twins (STB_SITES=0)")


@pytest.fixture(scope="module")
def twin_jobs(slurm_cluster, tmp_path_factory):
    """Every (site, launch mode) job submitted at once, then waited for: {(site, launch): (state, log,
    out)}."""
    base = tmp_path_factory.mktemp("twins")
    submitted = {}
    for site, (profile, partition, _, _, extra) in SITES.items():
        for launch in ("srun", "torchrun"):
            where = base / f"{site}-{launch}"
            where.mkdir()
            config = where / "job.toml"
            config.write_text(
                JOB.format(
                    profile=profile,
                    partition=partition,
                    launch=launch,
                    probe=PROBE,
                    out=where / "out",
                    extra=extra,
                )
            )
            r = _exatrain(slurm_cluster, "submit", "-c", str(config), f"--run.dir={where / 'run'}", cwd=where)
            assert r.returncode == 0, r.stdout + r.stderr
            job = r.stdout.split("submitted job ")[1].split()[0]
            log = Path(
                next(line.split("stdout  ", 1)[1] for line in r.stdout.splitlines() if "stdout  " in line)
            )
            submitted[site, launch] = (job, log, where / "out")
    done = {}
    for key, (job, log, out) in submitted.items():
        state = slurm_cluster.wait(job, timeout=420)
        done[key] = (state, log.read_text() if log.is_file() else f"(no {log})", out)
    return done


@pytest.mark.parametrize("partition", sorted(TWINS))
def test_twin_nodes_have_the_sites_interfaces(slurm_cluster, partition):
    nodes, interfaces = TWINS[partition]
    r = slurm_cluster.run(
        [
            "srun",
            f"--partition={partition}",
            "-N2",
            "--ntasks-per-node=1",
            "--mem=100",
            "bash",
            "-c",
            'echo "$(hostname) $(ls /sys/class/net | tr "\\n" " ")"',
        ],
        timeout=60,
    )
    assert r.returncode == 0, r.stderr + slurm_cluster.log_tail()
    seen = {line.split()[0]: set(line.split()[1:]) - {"lo"} for line in r.stdout.splitlines()}
    assert seen == {n: interfaces for n in nodes}, r.stdout


def _split(report: dict) -> tuple[list[dict], list[dict]]:
    """(the rank's connections to the store, its other connections to the other node: gloo's pairs)."""
    port = int(report["seen"]["MASTER_PORT"])
    cross = [
        c for c in report["connections"] if c["remote"] != c["local"] and not c["remote"].startswith("127.")
    ]
    return [c for c in cross if port in (c["rport"], c["lport"])], [
        c for c in cross if port not in (c["rport"], c["lport"])
    ]


@pytest.mark.parametrize("launch", ["srun", "torchrun"])
@pytest.mark.parametrize("site", sorted(SITES))
def test_gloo_job_uses_the_sites_data_network(twin_jobs, site, launch):
    """The rendered job completes on two twin nodes; gloo's pairs run over the site's data network (LUMI: hsn,
    JSC: ib0, generic: eth0) and the store over the network its master address names (JSC: the `i` name, also
    in torchrun mode, where torchrun's agent publishes it)."""
    state, log, out = twin_jobs[site, launch]
    assert state == "COMPLETED", log
    _, _, data, store_net, _ = SITES[site]
    reports = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]
    assert [r["host"] for r in reports] == TWINS[SITES[site][1]][0], log
    assert {r["sum"] for r in reports} == {3.0}
    for report in reports:
        store, pairs = _split(report)
        assert pairs and all(c["local"].startswith(data) for c in pairs), report
        assert all(c["local"].startswith(store_net) for c in store), report
        assert report["master_ip"].startswith(store_net), report
    if site == "juwels-booster":
        assert {r["seen"]["MASTER_ADDR"] for r in reports} == {"jwb0001i"}, log
        assert {r["seen"]["GLOO_SOCKET_IFNAME"] for r in reports} == {"ib0"}, log


def test_old_gloo_interface_list_fails_on_jsc_twin(slurm_cluster, tmp_path, twin_jobs):
    """c227ac3's GLOO_SOCKET_IFNAME=ib0,ib1,ib2,ib3, given to gloo as it was: every rank fails with gloo's own
    error on the first interface the node lacks (the fixed job above narrows it to ib0 and completes)."""
    env = dict(
        _path_env(),
        GLOO_SOCKET_IFNAME="ib0,ib1,ib2,ib3",
        MASTER_ADDR="jwb0001i",
        MASTER_PORT="29611",
        WORLD_SIZE="2",
    )
    r = slurm_cluster.run(
        [
            "srun",
            "--partition=booster",
            "-N2",
            "--ntasks-per-node=1",
            "bash",
            "-c",
            f"RANK=$SLURM_PROCID exec python {PROBE} {tmp_path} 30",
        ],
        env=env,
        timeout=120,
    )
    assert r.returncode != 0
    assert "Unable to find address for: ib1" in r.stdout + r.stderr, r.stdout + r.stderr
    assert not list(tmp_path.glob("rank-*.json"))


def test_plain_torchrun_on_jsc_twin_gives_workers_the_management_name(slurm_cluster, tmp_path, twin_jobs):
    """torchrun without --local-addr (c227ac3's torchrun line): the agent of node 0 publishes its plain host
    name, the management network, so the workers' store connection is refused there and the group never forms
    (the rendered job above advertises jwb0001i and completes)."""
    is_host = '--rdzv-conf=is_host=$([ "$SLURM_NODEID" = 0 ] && echo true || echo false)'
    agent = (
        f"exec torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=jwb0001i:29612 "
        f"--rdzv-id=old {is_host} {PROBE} {tmp_path} 15"
    )
    r = slurm_cluster.run(
        ["srun", "--partition=booster", "-N2", "--ntasks-per-node=1", "bash", "-c", agent],
        env=dict(_path_env(), GLOO_SOCKET_IFNAME="ib0"),
        timeout=180,
    )
    text = r.stdout + r.stderr
    assert r.returncode != 0, text
    assert "'MASTER_ADDR': 'jwb0001'" in text, text  # the workers were given the plain (management) name
    assert not list(tmp_path.glob("rank-*.json")), text


def test_torch_2_4_fallback_gives_workers_the_i_name(slurm_cluster, tmp_path, twin_jobs):
    """The rendezvous words for a job whose torch has no --local-addr (2.4: the static rendezvous), run by
    this machine's torchrun (2.13; the static rendezvous hands its workers --master-addr in both): the workers
    get jwb0001i and the group forms over ib0."""
    shared, per_node = rendezvous_words("i", (2, 4))
    agent = (
        f"RDZV_HEAD=jwb0001 RDZV_PORT=29613; exec torchrun {' '.join(shared)} {' '.join(per_node)} "
        f"--nproc-per-node=1 {PROBE} {tmp_path} 60"
    )
    r = slurm_cluster.run(
        ["srun", "--partition=booster", "-N2", "--ntasks-per-node=1", "bash", "-c", agent],
        env=dict(_path_env(), GLOO_SOCKET_IFNAME="ib0"),
        timeout=180,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    reports = [json.loads((tmp_path / f"rank-{i}.json").read_text()) for i in range(2)]
    assert {r["seen"]["MASTER_ADDR"] for r in reports} == {"jwb0001i"}
    assert all(c["local"].startswith("10.79.") for r in reports for c in _split(r)[1])


def test_interface_on_no_node_fails_in_seconds_with_a_hint(slurm_cluster, tmp_path):
    """A GLOO_SOCKET_IFNAME naming no interface of the node: `exatrain run` (srun mode) and the node shell of
    torchrun mode (python3 -m exatrain.env.nics) stop at once, naming the interface and the node."""
    env = dict(_path_env(), GLOO_SOCKET_IFNAME="hsn0")
    for cmd in (
        ["python", "-m", "exatrain.cli.main", "run", str(PROBE), str(tmp_path)],
        ["python3", "-m", "exatrain.env.nics"],
    ):
        r = slurm_cluster.run(
            ["srun", "--partition=generic", "-N2", "--ntasks-per-node=1", "--mem=100", *cmd],
            env=env,
            timeout=60,
        )
        text = r.stdout + r.stderr
        assert r.returncode != 0, text
        for node in ("gen1", "gen2"):
            assert f"GLOO_SOCKET_IFNAME=hsn0: node {node} has none of these network interfaces" in text, text
        assert "HINT: name interfaces node gen1 has" in text, text
