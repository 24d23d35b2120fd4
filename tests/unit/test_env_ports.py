"""Rendezvous ports: derived per job and step, validated when given."""

from pathlib import Path

import pytest

from exatrain.env import check_port, derive_port
from exatrain.errors import ClusterEnvError


@pytest.mark.parametrize(("a", "b"), [("1001", "11001"), ("123456", "223456"), ("4242", "14242")])
def test_jobs_sharing_last_digits_get_distinct_ports(a, b):
    assert derive_port(a) != derive_port(b)


def test_port_is_stable_and_below_the_kernels_ephemeral_ports():
    """A derived port in the ephemeral range can already be held by an outgoing connection on the node
    (seen in CI: rank 0's store failed with EADDRINUSE and the other ranks waited out the timeout)."""
    ports = [derive_port(str(job), step) for job in range(1000, 1200) for step in (None, "0", "1")]
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    first_ephemeral = int(ephemeral.read_text().split()[0]) if ephemeral.is_file() else 32768
    assert all(20000 <= port < min(first_ephemeral, 32768) for port in ports)
    assert max(ports) > 30000  # the range is used, not a corner of it
    assert derive_port("1234567", "3") == derive_port("1234567", "3")


def test_steps_of_one_job_get_distinct_ports():
    ports = [derive_port("987654", None)] + [derive_port("987654", str(step)) for step in range(8)]
    assert len(set(ports)) == len(ports)


def test_custom_range():
    assert all(30000 <= derive_port(str(job), low=30000, high=30010) < 30010 for job in range(50))


def test_bad_range_is_a_programming_error():
    with pytest.raises(ValueError):
        derive_port("1", low=5000, high=5000)


@pytest.mark.parametrize(("value", "port"), [("29500", 29500), (1024, 1024), (" 65535 ", 65535)])
def test_check_port_accepts(value, port):
    assert check_port(value, "MASTER_PORT") == port


@pytest.mark.parametrize("value", ["80", "65536", "http", "", "29500.5", True, None, 0])
def test_check_port_rejects(value):
    with pytest.raises(ClusterEnvError) as info:
        check_port(value, "MASTER_PORT")
    text = str(info.value)
    assert "MASTER_PORT" in text and repr(value) in text
    assert "HINT:" in text and "1024" in text and "65535" in text


def test_derived_ports_spread_out():
    ports = {derive_port(str(job)) for job in range(2000, 2100)}
    assert len(ports) >= 95  # a hash, not a counter: a few collisions among 100 jobs are possible
