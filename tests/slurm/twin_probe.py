"""A user's gloo script for the site twins (test_twins.py): joins the group torchrun's variables describe,
runs one all-reduce, and writes what it saw to OUT/rank-R.json: its host, MASTER_ADDR, GLOO_SOCKET_IFNAME, the
sum, and the local and remote addresses of its own established TCP connections (from /proc/net/tcp of its
node's network namespace), so the test can say which network gloo and the store really used.

usage: python twin_probe.py OUT_DIR [TIMEOUT_S]
"""

import datetime
import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def _own_socket_inodes() -> set[str]:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return inodes


def _ip(hex_addr: str) -> str:
    return socket.inet_ntoa(bytes.fromhex(hex_addr)[::-1])


def connections() -> list[dict]:
    """This process's established IPv4 TCP connections: local and remote address and port."""
    mine, found = _own_socket_inodes(), []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] != "01" or fields[9] not in mine:  # 01 = ESTABLISHED
            continue
        (local, lport), (remote, rport) = (f.split(":") for f in fields[1:3])
        found.append(
            {"local": _ip(local), "lport": int(lport, 16), "remote": _ip(remote), "rport": int(rport, 16)}
        )
    return found


def main() -> None:
    out, timeout = Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 120.0
    out.mkdir(parents=True, exist_ok=True)
    seen = {k: os.environ.get(k, "") for k in ("MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "RANK")}
    print(f"probe on {socket.gethostname()}: {seen}", flush=True)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    report = {
        "host": socket.gethostname(),
        "seen": seen,
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
        "sum": total.item(),
        "master_ip": socket.gethostbyname(seen["MASTER_ADDR"]),
        "connections": connections(),
    }
    dist.barrier()
    (out / f"rank-{dist.get_rank()}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
