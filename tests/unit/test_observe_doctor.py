"""The doctor's per-node checks and its reading of NCCL_DEBUG=INFO logs.

No GPU and no fabric here, so no NCCL log can be produced (gloo writes none): the excerpts below are copied
from real NCCL/RCCL logs that users posted in public GitHub issues (named above each; unchanged except that
lines of other ranks were left out). Interfaces and plugins are looked up in a temporary /sys/class/net and
library directory."""

import os
import shutil

import pytest
import torch

from exatrain.distributed import nccl_debug
from exatrain.errors import ConfigError
from exatrain.tools.doctor import probes as doctor

# NVIDIA/nccl-tests#185: NCCL 2.19.3, its own IB transport over RoCE, no plugin
IB_ROCE = """\
dgxh100-4:460770:460770 [0] NCCL INFO Bootstrap : Using enp220s0np0:11.1.128.136<0>
dgxh100-4:460770:460770 [0] NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: \
No such file or directory No plugin found (libnccl-net.so), using internal implementation
dgxh100-4:460770:460770 [0] NCCL INFO cudaDriverVersion 12000
NCCL version 2.19.3+cuda12.3
dgxh100-4:460770:460842 [0] NCCL INFO NET/IB : Using [0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]; OOB \
enp220s0np0:11.1.128.136<0>
dgxh100-4:460770:460842 [0] NCCL INFO Using non-device net plugin version 0
dgxh100-4:460770:460842 [0] NCCL INFO Using network IB
"""
# ROCm/rccl#419: RCCL on InfiniBand, no librccl-net.so
RCCL_IB = """\
e05r3n09:929:929 [2] NCCL INFO Bootstrap : Using ib0:11.5.5.50<0>
e05r3n09:929:929 [2] NCCL INFO NET/Plugin : No plugin found (librccl-net.so), using internal implementation
e05r3n09:929:929 [2] NCCL INFO NET/IB : Using [0]mlx5_3:1/IB [1]mlx5_2:1/IB [2]mlx5_1:1/IB [3]mlx5_0:1/IB ; \
OOB ib0:11.5.5.50<0>
e05r3n09:929:929 [2] NCCL INFO Using network IB
"""
# NVIDIA/nccl#1357: HPC-X's RDMA/SHARP plugin ("IBext"); plugin lines of rank 0 on one node, network lines
# of rank 3 on the other node of the same job
IBEXT = """\
qh100-gpu20:39629:39686 [0] NCCL INFO NET/Plugin: Failed to find ncclNetPlugin_v8 symbol.
qh100-gpu20:39629:39686 [0] NCCL INFO NET/Plugin: Loaded net plugin NCCL RDMA Plugin v6 (v6)
qh100-gpu20:39629:39686 [0] NCCL INFO NET/Plugin: Failed to find ncclCollNetPlugin_v8 symbol.
qh100-gpu20:39629:39686 [0] NCCL INFO NET/Plugin: Loaded collnet plugin SHARP (v6)
qh100-gpu20:39629:39686 [0] NCCL INFO Plugin Path : /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so
qh100-gpu20:39629:39686 [0] NCCL INFO P2P plugin IBext
qh100-gpu19:49357:49418 [3] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB/SHARP [1]mlx5_1:1/IB/SHARP \
[2]mlx5_4:1/IB/SHARP [3]mlx5_5:1/IB/SHARP [RO]; OOB ibp25s0:10.20.0.119<0>
qh100-gpu19:49357:49418 [3] NCCL INFO Using network IBext
"""
# aws/aws-ofi-nccl#801: aws-ofi-nccl 1.6.0 on HPE Slingshot (libfabric's cxi provider, as on LUMI); the
# poster had cut the host:pid:tid prefixes
OFI_SLINGSHOT = """\
NCCL INFO NET/OFI Selected Provider is cxi (found 8 nics)
[0] NCCL INFO Using non-device net plugin version 0
[0] NCCL INFO Using network AWS Libfabric
[0] NCCL INFO DMA-BUF is available on GPU device 0
[0] NCCL INFO NET/OFI Using aws-ofi-nccl 1.6.0
"""
# aws/aws-ofi-nccl#161: aws-ofi-nccl 1.3.0 on AWS EFA, NCCL 2.10.3
OFI_EFA = """\
algo-1:462:462 [0] NCCL INFO Bootstrap : Using eth0:10.200.5.135<0>
algo-1:462:462 [0] NCCL INFO NET/Plugin: Failed to find ncclCollNetPlugin_v4 symbol.
algo-1:462:462 [0] NCCL INFO NET/OFI Using aws-ofi-nccl 1.3.0aws
algo-1:462:462 [0] NCCL INFO NET/OFI Setting FI_EFA_FORK_SAFE environment variable to 1
algo-1:462:462 [0] NCCL INFO NET/OFI Forcing AWS OFI ndev 2
algo-1:462:462 [0] NCCL INFO NET/OFI Selected Provider is efa
algo-1:462:462 [0] NCCL INFO Using network AWS Libfabric
"""
# NVIDIA/nccl-tests#188: IB switched off (NCCL_IB_DISABLE=1), so TCP over the IB interfaces
SOCKET = """\
user:852750:852802 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.
user:852750:852802 [0] NCCL INFO NET/Socket : Using [0]ibs85f0:192.168.1.14<0> [1]ib0:192.168.1.15<0>
user:852750:852802 [0] NCCL INFO Using network Socket
"""
# ROCm/rccl-tests#163: RCCL 2.21.5 without libibverbs and without a plugin: TCP
RCCL_SOCKET = """\
z292:58192:58192 [0] NCCL INFO Bootstrap : Using eno2np1:192.168.2.194<0>
z292:58192:58192 [0] NCCL INFO NET/Plugin: No plugin found (librccl-net.so)
z292:58192:58192 [0] NCCL INFO NET/Plugin: Plugin load returned 2 : librccl-net.so: cannot open shared \
object file: No such file or directory : when loading librccl-net.so
z292:58192:58192 [0] NCCL INFO NET/Plugin: Using internal network plugin.
z292:58192:58200 [2] NCCL INFO Failed to open libibverbs.so[.1]
z292:58192:58200 [2] NCCL INFO NET/Socket : Using [0]eno2np1:192.168.2.194<0>
z292:58192:58200 [2] NCCL INFO Using non-device net plugin version 0
z292:58192:58200 [2] NCCL INFO Using network Socket
"""
# Mellanox/nv_peer_memory#56: NCCL 2.4.7 prints no "Using network" line; both transports report, IB wins
OLD_NCCL_IB = """\
master_node:20:289 [0] NCCL INFO NET/Socket : Using [0]ib0:192.168.11.1<0>
master_node:20:289 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so).
master_node:20:289 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 0.
master_node:20:289 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:192.168.11.1<0>
"""


@pytest.mark.parametrize(
    "log, network, plugin",
    [
        (IB_ROCE, "IB", "internal"),
        (RCCL_IB, "IB", "internal"),
        (IBEXT, "IB", "NCCL RDMA Plugin v6"),
        (OFI_SLINGSHOT, "OFI", "aws-ofi-nccl 1.6.0"),
        (OFI_EFA, "OFI", "aws-ofi-nccl 1.3.0aws"),
        (SOCKET, "Socket", None),
        (RCCL_SOCKET, "Socket", "internal"),
        (OLD_NCCL_IB, "IB", "internal"),
        ("", None, None),
    ],
)
def test_nccl_network_and_plugin_from_real_logs(log, network, plugin):
    assert doctor.nccl_setup(log) == {"network": network, "plugin": plugin}


def test_nccl_debug_variables_point_each_rank_at_its_own_file(tmp_path, monkeypatch):
    """What `exatrain doctor` sets before its process group's first NCCL communicator."""
    for name in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert nccl_debug.nccl_debug_env(tmp_path, 3) == {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
        "NCCL_DEBUG_FILE": str(tmp_path / "nccl-rank3.log"),
    }
    path = nccl_debug.enable_nccl_debug_log(tmp_path / "logs", 5)
    assert path == tmp_path / "logs" / "nccl-rank5.log" and path.parent.is_dir()
    assert os.environ["NCCL_DEBUG"] == "INFO" and os.environ["NCCL_DEBUG_FILE"] == str(path)
    assert "%" not in os.environ["NCCL_DEBUG_FILE"]  # NCCL would expand %h / %p


def test_per_rank_nccl_logs_fail_a_multi_node_job_on_sockets(tmp_path):
    """The files NCCL would write for ranks on two nodes (real excerpts as their contents): the doctor's
    per-rank reading of them, and the check that fails when any rank talks TCP between nodes."""
    from exatrain.tools.doctor.command import _nccl_report

    def reports(logs):
        out = []
        for rank, log in enumerate(logs):
            path = nccl_debug.nccl_debug_log_path(tmp_path, rank)
            path.write_text(log)
            out.append(
                {
                    "rank": rank,
                    "host": f"nid00{rank}",
                    "device": "cuda:0",
                    "visible_gpus": 1,
                    "ranks_on_node": 1,
                    "interfaces": ["hsn0"],
                    "caches": {},
                    "nccl": _nccl_report(path),
                }
            )
        return out

    good = reports([OFI_SLINGSHOT, OFI_SLINGSHOT])
    assert good[1]["nccl"] == {
        "network": "OFI",
        "plugin": "aws-ofi-nccl 1.6.0",
        "log": str(tmp_path / "nccl-rank1.log"),
    }
    assert doctor.failures(good, "nccl") == []
    [(problem, hint)] = doctor.failures(reports([OFI_SLINGSHOT, RCCL_SOCKET]), "nccl")
    assert problem.startswith("NCCL uses NET/Socket between nodes (TCP) (rank(s) 1)") and "aws-ofi" in hint
    single_node = [dict(r, host="nid000") for r in reports([SOCKET, SOCKET])]
    assert doctor.failures(single_node, "nccl") == []  # one node: NCCL's network is not used
    assert _nccl_report(tmp_path / "missing.log")["network"] is None  # NCCL wrote nothing (yet)


def test_socket_between_nodes_fails_with_a_hint():
    reports = [
        {
            "rank": r,
            "host": f"nid00{r}",
            "device": "cuda:0",
            "visible_gpus": 1,
            "ranks_on_node": 1,
            "interfaces": ["hsn0"],
            "caches": {"/tmp": True},
        }
        for r in range(2)
    ]
    assert doctor.failures(reports, "nccl", "OFI") == []
    [(problem, hint)] = doctor.failures(reports, "nccl", "Socket")
    assert "NET/Socket" in problem and "aws-ofi" in hint
    assert doctor.failures(reports, "gloo", "Socket") == []  # gloo always uses TCP


def test_gpu_visibility_and_caches_are_checked():
    base = {"rank": 3, "host": "n1", "device": "cuda:0", "ranks_on_node": 4, "interfaces": [], "caches": {}}
    assert doctor.failures([dict(base, visible_gpus=1)], "nccl", None) == []
    assert doctor.failures([dict(base, visible_gpus=4)], "nccl", None) == []
    [(problem, _)] = doctor.failures([dict(base, visible_gpus=2)], "nccl", None)
    assert problem == "rank 3 on n1: sees 2 GPU(s) with 4 rank(s) on the node"
    [(problem, hint)] = doctor.failures(
        [dict(base, visible_gpus=1, caches={"/scratch": False})], "nccl", None
    )
    assert "/scratch is not writable" in problem and hint


def test_a_profile_whose_gpu_memory_is_not_the_gpus_gets_a_warning_with_the_size_to_use(exatrain_cli):
    """An H200 node (143771 MiB, as nvidia-smi reads one) under the generic-nvidia profile (80): the doctor
    warns and gives the size; an H100 80GB (81559 MiB: 79.6 GiB) matches its 80 within the tolerance; a CPU
    rank or a profile without the key gets nothing. The HINT's advice makes exatrain plan judge against the
    GPU's own size."""
    h200, h100 = 143771 / 1024, 81559 / 1024
    warning = doctor.gpu_memory_warning([{"gpu_memory_gib": h200}], 80.0, "generic-nvidia")
    assert warning.startswith("WARNING: site profile 'generic-nvidia' gives gpu_memory_gb = 80, but the GPUs")
    assert "have 140.4 GiB" in warning and "\nHINT: pass --gpu-memory-gb 140 to exatrain plan" in warning
    assert doctor.gpu_memory_warning([{"gpu_memory_gib": h100}], 80.0, "generic-nvidia") is None
    assert doctor.gpu_memory_warning([{"gpu_memory_gib": None}], 80.0, "cpu") is None
    assert doctor.gpu_memory_warning([{"gpu_memory_gib": h200}], 0.0, "mine.toml") is None
    # the smallest GPU of the job decides (a node with a smaller card)
    assert "have 79.6 GiB" in doctor.gpu_memory_warning(
        [{"gpu_memory_gib": h200}, {"gpu_memory_gib": h100}], 140.0, "h200-site"
    )
    args = ["plan", "--world-size=1", "--site=generic-nvidia", "--model.size=small", "--json"]
    import json

    default = json.loads(exatrain_cli(*args).stdout)
    given = json.loads(exatrain_cli(*args, "--gpu-memory-gb=140").stdout)
    assert default["gpu_memory_gb"] == 80 and given["gpu_memory_gb"] == 140


def test_interfaces_plugins_and_sizes(tmp_path):
    net = tmp_path / "net"
    for name in ("lo", "eth0", "hsn0", "hsn1", "ib0"):
        (net / name).mkdir(parents=True)
    assert doctor.high_speed_interfaces(str(net)) == ["hsn0", "hsn1", "ib0"]
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libnccl-net-ofi.so").touch()
    (lib / "libc.so").touch()
    assert doctor.network_plugins(f"/nonexistent:{lib}") == [str(lib / "libnccl-net-ofi.so")]
    assert doctor.parse_size("256MiB") == 256 * 2**20 and doctor.parse_size("4096") == 4096
    assert doctor.sweep_sizes(2**20) == [1024, 4096, 16384, 65536, 262144, 1048576]
    assert doctor.writable(tmp_path) and not doctor.writable("/proc")
    with pytest.raises(ConfigError, match="size '1TB'") as bad:
        doctor.parse_size("1TB")
    assert "--max-size 256MiB" in bad.value.hint


def test_doctor_sets_nccl_logging_before_joining_the_group(tmp_path, monkeypatch):
    """On a GPU node the doctor's ranks enable NCCL's log before init_distributed creates the group (NCCL
    reads the variables once, at its first communicator). No GPU here: `_may_use_nccl` is forced true and the
    group set-up is replaced by a recorder that stops the doctor there."""
    import argparse

    from exatrain.env import detect_environment
    from exatrain.tools.doctor import command as cli_doctor

    class Stop(Exception):
        pass

    seen = {}

    def record(env, *args, **kwargs):
        seen.update({k: os.environ.get(k) for k in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")})
        raise Stop

    for name in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cli_doctor, "_may_use_nccl", lambda device: True)
    monkeypatch.setattr(cli_doctor, "init_distributed", record)
    args = argparse.Namespace(
        nccl_log_dir=str(tmp_path / "nccl"),
        nccl_log="",
        device="auto",
        timeout=5.0,
        verdict_dir="",
        max_size="4KiB",
        iters=1,
    )
    with pytest.raises(Stop):
        cli_doctor.doctor_here(detect_environment({}), args)
    assert seen == {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
        "NCCL_DEBUG_FILE": str(tmp_path / "nccl" / "nccl-rank0.log"),
    }


@pytest.mark.parametrize("ranks, factor", [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75), (16, 1.875)])
def test_bus_bandwidth_is_nccl_tests_for_all_reduce(ranks, factor):
    """nccl-tests (doc/PERFORMANCE.md): all_reduce busbw = algbw x 2(n-1)/n; the factors are that page's."""
    assert doctor.all_reduce_bus_bandwidth(10.0, ranks) == pytest.approx(10.0 * factor)


TOPO = """\
\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV18\t0-47\t0
GPU1\tNV18\t X \t0-47\t0
"""


def _tool(bin_dir, name, body):
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_gpu_links_from_the_first_tool_that_answers(tmp_path, monkeypatch):
    """Stand-in `nvidia-smi` / `rocm-smi` scripts on PATH (no GPU here): the link matrix of the first tool
    that answers `topo -m` / `--showtopo`; a tool that fails gives way to the next; none at all gives None."""
    cat = shutil.which("cat")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))  # only the stand-ins, also on a machine with real tools
    assert doctor.gpu_links() is None
    _tool(bin_dir, "rocm-smi", 'test "$1" = --showtopo && echo "ROCm topology: GPU0 GPU1 XGMI" || exit 9')
    assert doctor.gpu_links() == "ROCm topology: GPU0 GPU1 XGMI"
    (tmp_path / "topo.txt").write_text(TOPO)
    _tool(bin_dir, "nvidia-smi", f'test "$*" = "topo -m" && {cat} {tmp_path / "topo.txt"} || exit 9')
    assert doctor.gpu_links() == TOPO.strip()
    _tool(
        bin_dir, "nvidia-smi", "echo 'NVIDIA-SMI has failed' >&2; exit 9"
    )  # no driver: the next tool answers
    assert doctor.gpu_links() == "ROCm topology: GPU0 GPU1 XGMI"


def test_hardware_lines_parse_as_the_profiles_hardware_table():
    """Ranks on two nodes: the slowest rank's matmul rate and the largest message's busbw as the inter-node
    bandwidth, with the profile's data-sheet peak; the lines parse as a profile's [hardware] table."""
    from exatrain.config.load import read_toml, tomllib
    from exatrain.slurm.profiles import PROFILE_DIR, profile_from_dict

    what = "fp32 c = a + b over 1024 MiB tensors (STREAM Add)"
    reports = [
        {"host": "n1", "matmul_tflops": 150.0, "matmul_what": "bfloat16 8192x8192 products"},
        {"host": "n2", "matmul_tflops": 140.5, "matmul_what": "bfloat16 8192x8192 products"},
    ]
    reports[0].update(hbm_gbs=1200.0, hbm_what=what)
    reports[1].update(hbm_gbs=1350.5, hbm_what=what)
    attention = "bfloat16 causal attention, 64 heads x 2048 tokens x 128, forward + backward"
    reports[0].update(attention_tflops=101.0, attention_what=attention)
    reports[1].update(attention_tflops=99.5, attention_what=attention)
    sweep = [{"bytes": 1024, "busbw_gbs": 0.5}, {"bytes": 2**28, "busbw_gbs": 21.25}]
    table = tomllib.loads("\n".join(doctor.hardware_lines(reports, sweep, 191.5)))["hardware"]
    data = read_toml(str(PROFILE_DIR / "lumi-g.toml"))
    hw = profile_from_dict({**data, "hardware": table}).hardware
    assert (hw.peak_tflops, hw.matmul_tflops, hw.inter_node_busbw_gbs) == (191.5, 140.5, 21.25)
    assert hw.intra_node_busbw_gbs == 0
    assert hw.hbm_gbs == 1200.0  # the slowest rank's memory bandwidth
    assert hw.attention_tflops == 99.5  # the slowest rank's attention rate
    assert hw.source == "measured"  # so `exatrain plan --time` says its constants were measured
    # the whole sweep, as the inter-node busbw's curve by size (the plan's busbw at each call's size)
    assert hw.inter_node_busbw_curve == ((1024.0, 0.5), (2.0**28, 21.25))
    assert hw.intra_node_busbw_curve == ()


def test_hardware_lines_warn_when_the_nodes_were_not_filled():
    """The plan reads the inter-node busbw as that of a group of whole nodes (it scales it down for groups
    with fewer ranks per node), so a sweep run with one rank on each 4-GPU node says so, in a comment that
    keeps the lines a valid table; with a rank per GPU it does not."""
    from exatrain.config.load import tomllib

    sweep = [{"bytes": 2**28, "busbw_gbs": 21.25}]
    thin = [
        {"host": h, "matmul_tflops": 1.0, "matmul_what": "", "visible_gpus": 4, "ranks_on_node": 1}
        for h in "ab"
    ]
    lines = doctor.hardware_lines(thin, sweep)
    assert any(
        line.startswith("# WARNING: fewer ranks than GPUs on a node") and "HINT:" in line for line in lines
    )
    assert tomllib.loads("\n".join(lines))["hardware"]["inter_node_busbw_gbs"] == 21.25
    full = [{**r, "visible_gpus": 1, "ranks_on_node": 4} for r in thin]  # one GPU bound to each rank
    assert not any("WARNING" in line for line in doctor.hardware_lines(full, sweep))
    one_node = [{**thin[0]}, {**thin[0]}]  # one node: its busbw is the intra-node one, whatever the ranks
    assert not any("WARNING" in line for line in doctor.hardware_lines(one_node, sweep))


def test_attention_rate_counts_the_full_products_of_forward_and_backward(monkeypatch):
    """12 B H T^2 d FLOPs per causal forward + backward (the step-time model's count: no causal halving):
    with a clock that says 3 timed calls took 2 s, 2^13 / 128 = 64 heads of 128 tokens x 32 give
    3 x 12 x 64 x 128^2 x 32 FLOPs / 2 s; the shape defaults to 512 x 64 on a CPU."""
    clock = iter([10.0, 12.0])
    monkeypatch.setattr(doctor.time, "perf_counter", lambda: next(clock))
    tflops, what = doctor.attention_tflops(torch.device("cpu"), seq_len=128, head_dim=32, iters=3)
    assert tflops == pytest.approx(3 * 12 * 64 * 128**2 * 32 / 2 / 1e12)
    assert what == "float32 causal attention, 64 heads x 128 tokens x 32, forward + backward"
    clock = iter([0.0, 1.0])
    assert "16 heads x 512 tokens x 64" in doctor.attention_tflops(torch.device("cpu"), iters=1)[1]


def test_attention_rate_is_timed_with_the_jobs_dropout(monkeypatch):
    """A job with model.dropout > 0 runs its attention with that dropout (slower: a GPU's kernel draws the
    mask inside, a CPU takes the math path), so the probe times the kernel with it and says so; the job
    shape carries the dropout from the config."""
    import torch.nn.functional as F

    from exatrain.tools.doctor.settings import job_shape

    seen = []
    sdpa = F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        seen.append(kwargs.get("dropout_p"))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    what = doctor.attention_tflops(torch.device("cpu"), seq_len=16, head_dim=8, iters=1, dropout=0.1)[1]
    assert set(seen) == {0.1}
    assert what.endswith("forward + backward, dropout 0.1")
    seen.clear()
    assert "dropout" not in doctor.attention_tflops(torch.device("cpu"), seq_len=16, head_dim=8, iters=1)[1]
    assert set(seen) == {0.0}
    assert job_shape(None, ["--model.size=tiny", "--model.dropout=0.1"]).dropout == 0.1


def test_job_shape_is_the_jobs_model_when_its_config_is_given(tmp_path):
    """The probes time the job's shapes: from -c FILE or [model] / [data] / [train] overrides; other
    overrides alone leave the probes' defaults (None). Tokens are one rank's micro-batch."""
    from exatrain.tools.doctor.settings import JobShape, job_shape

    assert job_shape(None, []) is None
    assert job_shape(None, ["--run.hang_timeout_s=0"]) is None
    tiny = ["--model.size=tiny", "--data.seq_len=128", "--data.kind=synthetic", "--train.micro_batch_size=4"]
    # tiny: dim 128, 2 layers, 4 heads (models/sizes.py); MLP 4 x dim; synthetic data's 512 tokens
    assert job_shape(None, tiny) == JobShape(128, 32, 128, 512, 2, 512, 4 * 128)
    config = tmp_path / "job.toml"
    config.write_text("[model]\ndim = 1024\nn_heads = 8\n[data]\nseq_len = 4096\n")
    shape = job_shape(str(config), [])
    assert (shape.seq_len, shape.head_dim, shape.dim, shape.hidden) == (4096, 128, 1024, 4096)


def test_matmul_rate_of_the_jobs_products_weights_blocks_and_head(monkeypatch):
    """With the job's shape the rate is the step's linear products: per block wq, wk, wv, wo (dim x dim)
    and w1, w2 (dim x hidden), and the head (dim x vocabulary), each 3 products of 2 x tokens x in x out
    FLOPs. Dim 4, hidden 8, vocabulary 16, 32 tokens: a block is 6 x 32 x (4 x 16 + 32 + 32) = 24576
    FLOPs, the head 6 x 32 x 64 = 12288. A clock that says a block's call took 2 s and the head's 1 s
    gives, over 3 blocks and the head, (3 x 24576 + 12288) FLOPs / (3 x 2 + 1) s."""
    from exatrain.tools.doctor.settings import JobShape

    clock = iter([0.0, 2.0, 10.0, 11.0])
    monkeypatch.setattr(doctor.time, "perf_counter", lambda: next(clock))
    shape = JobShape(seq_len=8, head_dim=2, dim=4, hidden=8, n_layers=3, vocab=16, tokens=32)
    tflops, what = doctor.matmul_tflops(torch.device("cpu"), iters=1, shape=shape)
    assert tflops == pytest.approx((3 * 24576 + 12288) / 7 / 1e12)
    assert what == (
        "float32 products of the job's linear layers at 32 tokens (dim 4, hidden 8, vocabulary 16), forward "
        "and backward, 3 blocks + head"
    )
    # a micro-batch beyond the CPU's 2^11 rows is timed at 2^11 (the rate has saturated; the time and the
    # head's memory have not), and the line says so
    clock = iter([0.0, 1.0, 2.0, 3.0])
    big = JobShape(seq_len=8, head_dim=2, dim=4, hidden=8, n_layers=3, vocab=16, tokens=10**6)
    what = doctor.matmul_tflops(torch.device("cpu"), iters=1, shape=big)[1]
    assert "at 2048 tokens (of the job's 1000000)" in what


def test_memory_bandwidth_counts_bytes_read_and_written(monkeypatch):
    """STREAM's Add: c = a + b reads 2 and writes 1 fp32 tensor per call; with a clock that says the timed
    calls took 2 s, 3 calls over 2^20 elements are 3 x 12 x 2^20 bytes / 2 s."""
    clock = iter([10.0, 12.0])
    monkeypatch.setattr(doctor.time, "perf_counter", lambda: next(clock))
    gbs, what = doctor.memory_gbs(torch.device("cpu"), elements=2**20, iters=3)
    assert gbs == pytest.approx(3 * 12 * 2**20 / 2 / 1e9)
    assert what == "fp32 c = a + b over 4 MiB tensors (STREAM Add)"
