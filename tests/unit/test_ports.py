"""tests/ports.py: each pytest-xdist worker's ports are its own, outside the kernel's ephemeral range and the
SLURM test cluster's ports, never handed out twice within a block, and a port in use is skipped."""

import inspect
import socket
from pathlib import Path

import pytest

import tests.ports as ports
from exatrain.env.ports import derive_port


def _draw(monkeypatch, worker: str | None, n: int) -> list[int]:
    if worker is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setattr(ports, "_ports", None)
    return [ports.free_port() for _ in range(n)]


def test_workers_draw_from_disjoint_blocks_no_one_else_uses(monkeypatch):
    low, _high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    derived_low = inspect.signature(derive_port).parameters["low"].default  # rendezvous ports of SLURM jobs
    # the blocks themselves, whatever this machine's other sockets hold now (earlier tests leave TIME_WAIT)
    monkeypatch.setattr(ports, "_in_use", lambda port: False)
    drawn = {w: set(_draw(monkeypatch, w, 500)) for w in ("gw0", "gw1", None)}
    assert [len(d) for d in drawn.values()] == [500, 500, 500]  # a whole block, no port twice
    assert not drawn["gw0"] & drawn["gw1"] and not (drawn["gw0"] | drawn["gw1"]) & drawn[None]
    every = set().union(*drawn.values())
    assert max(every) < min(low, 16817, derived_low), "ephemeral, testbed (STB_CTLD_PORT) or derived ports"


def test_a_port_in_use_is_skipped(monkeypatch):
    first = _draw(monkeypatch, "gw1", 1)[0]  # a fresh draw in this process starts there again
    real = ports._in_use  # the real check for the busy port; the block's others as if free (the other
    monkeypatch.setattr(ports, "_in_use", lambda port: port == first and real(port))  # worker uses them)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", first))
        busy.listen()
        again = _draw(monkeypatch, "gw1", len(ports._block()) - 1)
    assert set(again) == set(ports._block()) - {first}


def test_every_port_in_use_is_an_error(monkeypatch):
    monkeypatch.setattr(ports, "_in_use", lambda port: True)
    with pytest.raises(RuntimeError, match="is in use"):
        _draw(monkeypatch, "gw0", 1)
