"""`exatrain doctor` from the command line: a real gloo all_reduce sweep on 2 local ranks, and a failed
check (an unwritable cache directory) giving exit code 1 and a HINT."""

import re

import pytest

pytestmark = pytest.mark.e2e


def test_doctor_on_two_local_ranks(exatrain_cli):
    r = exatrain_cli("doctor", "--nproc=2", "--max-size=64KiB", "--iters=2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "exatrain doctor: 2 rank(s) on 1 node(s), backend gloo" in r.stdout
    sizes = re.findall(r"│\s+(\d+ KiB) │\s+[\d,]+ us │\s+([\d.]+) │\s+([\d.]+) │", r.stdout)
    assert [s for s, _, _ in sizes] == ["1 KiB", "4 KiB", "16 KiB", "64 KiB"]
    assert all(float(bus) > 0 for _, _, bus in sizes)
    assert "doctor: all checks passed" in r.stdout


def test_doctor_fails_on_an_unwritable_cache(exatrain_cli):
    r = exatrain_cli("doctor", "--nproc=1", "--cache-dir=/proc")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL: rank 0 on " in r.stdout and "cache directory /proc is not writable" in r.stdout
    assert "HINT: " in r.stdout and "doctor: 1 check(s) failed" in r.stdout
