"""`exatrain monitor JOBID`: one live table of every GPU of a running SLURM job.

Attaches to the job's nodes with `srun --overlap --jobid JOBID` (one task per node, sharing the job's
resources with the running step) and reads each node's GPUs with `nvidia-smi` or `rocm-smi`
machine-readable output, as the course does by hand. Torch-free.
"""

from __future__ import annotations

import shlex
import time

from rich.console import Console
from rich.live import Live
from rich.table import Table

from exatrain.errors import ExatrainError
from exatrain.observe.gpu_monitor import NVIDIA_SMI_ARGS, ROCM_SMI_ARGS, parse_nvidia_smi, parse_rocm_smi
from exatrain.slurm.attach import job_nodes, on_every_node
from exatrain.slurm.runner import Runner

# what each node runs: its name, then which tool answered and the tool's output
NODE_SCRIPT = (
    'echo "host $(hostname)"; '
    "if command -v nvidia-smi >/dev/null; then echo tool nvidia-smi; nvidia-smi "
    f"{shlex.join(NVIDIA_SMI_ARGS)}; "
    f"elif command -v rocm-smi >/dev/null; then echo tool rocm-smi; rocm-smi {shlex.join(ROCM_SMI_ARGS)}; "
    "else echo tool none; fi"
)


def sample_job(runner: Runner, job_id: str, nodes: int) -> list[dict]:
    """One reading of every GPU of the job: [{"host", "tool", "gpus": [...]}, ...] sorted by host."""
    r = runner(on_every_node(job_id, nodes, ["sh", "-c", NODE_SCRIPT]))
    if r.returncode != 0:
        raise ExatrainError(
            f"srun --overlap --jobid={job_id} failed: {r.stderr.strip()[-500:]}",
            "the job may have ended; check it with `exatrain status`",
        )
    return parse_labelled(r.stdout)


def parse_labelled(text: str) -> list[dict]:
    """Group srun --label output ("TASK: line") by task and parse each node's tool output."""
    tasks: dict[str, list[str]] = {}
    for line in text.splitlines():
        task, sep, rest = line.partition(": ")
        if sep:
            tasks.setdefault(task.strip(), []).append(rest)
    nodes = []
    for lines in tasks.values():
        host = next((ln.removeprefix("host ") for ln in lines if ln.startswith("host ")), "?")
        tool = next((ln.removeprefix("tool ") for ln in lines if ln.startswith("tool ")), "none")
        body = "\n".join(ln for ln in lines if not ln.startswith(("host ", "tool ")))
        gpus = {"nvidia-smi": parse_nvidia_smi, "rocm-smi": parse_rocm_smi}.get(tool, lambda _: [])(body)
        nodes.append({"host": host, "tool": tool, "gpus": gpus})
    return sorted(nodes, key=lambda n: n["host"])


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def gpu_table(job_id: str, nodes: list[dict]) -> Table:
    """The table `exatrain monitor` shows: one row per GPU of the job."""
    t = Table(title=f"job {job_id}: {sum(len(n['gpus']) for n in nodes)} GPU(s) on {len(nodes)} node(s)")
    for col in ("node", "GPU", "name", "util %", "memory GiB", "power W", "temp C"):
        t.add_column(col, justify="left" if col in ("node", "name") else "right")
    for n in nodes:
        if not n["gpus"]:
            t.add_row(n["host"], "-", f"no GPU tool ({n['tool']})", "-", "-", "-", "-")
        for g in n["gpus"]:
            used, total = g["mem_used_mib"], g["mem_total_mib"]
            mem = f"{_cell(used and used / 1024, '.1f')} / {_cell(total and total / 1024, '.1f')}"
            t.add_row(
                n["host"],
                str(g["index"]),
                g["name"],
                _cell(g["util_pct"], ".0f"),
                mem,
                _cell(g["power_w"], ".0f"),
                _cell(g["temp_c"], ".0f"),
            )
    return t


def monitor(
    runner: Runner, job_id: str, interval_s: float = 5.0, once: bool = False, console: Console | None = None
) -> None:
    """Show the job's GPUs: one table (`once`), or a live table refreshed every `interval_s` until Ctrl-C
    or the job ends."""
    console = console or Console()
    nodes = job_nodes(runner, job_id)
    if once:
        console.print(gpu_table(job_id, sample_job(runner, job_id, nodes)))
        return
    with Live(
        gpu_table(job_id, sample_job(runner, job_id, nodes)), console=console, auto_refresh=False
    ) as live:
        while True:
            time.sleep(interval_s)
            live.update(gpu_table(job_id, sample_job(runner, job_id, nodes)), refresh=True)
