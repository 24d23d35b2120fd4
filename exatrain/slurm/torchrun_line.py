"""torchrun's options by torch release, and how exatrain's agent is asked for them. Never imports torch.

A script rendered on the login node cannot know the torch of the compute node (a container's, a module's),
so it never names an option newer than the floor. It starts exatrain's agent (`exatrain.launch.agent`, on
the compute node, with the job's python) with exatrain's own options first; the agent reads the job's torch
version (`exatrain.env.torch_version`) and either passes torchrun the options that release has, or provides
the same behaviour itself (docs/torch-versions.md).
"""

from __future__ import annotations

from exatrain.env.torch_version import torch_at_least
from exatrain.slurm.requeue import AGENT_SIGNALS

AGENT_MODULE = "exatrain.launch.agent"  # torchrun's agent run in-process by exatrain (python -m ...)

#: torchrun options newer than the floor, with the first release whose torch/distributed/run.py has them
#: (read in the released wheels on PyPI: 2.9.1 has neither, 2.10.0 the first, 2.12.0 both):
#: --signals-to-handle: pytorch/pytorch#160690 (for issue
#: #154849, "Torchrun should handle SIGUSR1 and SIGUSR2");
#: --shutdown-timeout: pytorch/pytorch#172596 (for issue #119856: the agent's 30 s before SIGKILL was fixed).
OPTION_SINCE = {"--signals-to-handle": (2, 10), "--shutdown-timeout": (2, 12)}

# exatrain's own options of `python -m exatrain.launch.agent`, before a `--` and torchrun's arguments.
HANDLE = "--handle-signals"  # signals the trainer treats as "time is up": forwarded to the workers
GRACE = "--shutdown-grace"  # seconds the workers get to checkpoint after such a signal
DEFAULT_GRACE = (
    30  # torchrun's own, before --shutdown-timeout (torch/distributed/elastic/multiprocessing/api.py)
)


def accepts(option: str, version: tuple[int, ...]) -> bool:
    """Whether the torchrun of torch ``version`` has ``option`` (options not in OPTION_SINCE: the floor has
    them)."""
    return torch_at_least(version, OPTION_SINCE.get(option, (0,)))


def native_signal_handling(version: tuple[int, ...]) -> bool:
    """Whether torchrun itself forwards extra signals and waits a chosen time for the workers (both options);
    else exatrain's agent does it (launch.agent)."""
    return accepts("--signals-to-handle", version) and accepts("--shutdown-timeout", version)


def extra_signals(names: str) -> list[str]:
    """``"USR2, SIGUSR1"`` -> ``["SIGUSR2", "SIGUSR1"]``: the signals beyond the ones every torchrun's agent
    handles (TERM, INT, HUP, QUIT), which kill an agent that does not handle them."""
    full = ["SIG" + n.strip().upper().removeprefix("SIG") for n in names.split(",") if n.strip()]
    return [n for n in dict.fromkeys(full) if n not in AGENT_SIGNALS]


def signal_options(version: tuple[int, ...], names: str, grace: int | None) -> list[str]:
    """torchrun's own options for ``names`` and ``grace`` where torch ``version`` has them, else none."""
    if not native_signal_handling(version) or not extra_signals(names):
        return []
    options = [f"--signals-to-handle={','.join([*AGENT_SIGNALS, *extra_signals(names)])}"]
    return options + ([f"--shutdown-timeout={grace}"] if grace else [])


def agent_options(names: str, grace: int | None = None) -> list[str]:
    """exatrain's agent options (before ``--``) asking for ``names`` to be forwarded with ``grace`` seconds to
    checkpoint; none when nothing beyond torchrun's defaults is asked."""
    extra = extra_signals(names)
    if not extra:
        return []
    return [f"{HANDLE}={','.join(extra)}"] + ([f"{GRACE}={grace}"] if grace else [])


def agent_start(job_signal: str, lead: int, python: str = "python3") -> str:
    """The start of a torchrun-mode rank command (shell words): exatrain's agent with the job's python on the
    compute node, asked to forward ``job_signal`` (``USR2@120``) and to give the workers its lead time (at
    least torchrun's 30 s) to checkpoint; torchrun's arguments follow the ``--``."""
    name = job_signal.split("@")[0].removeprefix("B:") if job_signal else ""
    return " ".join(
        ["exec", python, "-m", AGENT_MODULE, *agent_options(name, max(DEFAULT_GRACE, lead)), "--"]
    )


def agent_start_note(job_signal: str) -> list[str]:
    """Comment lines of the batch script saying what the agent decides on the node."""
    lines = [
        "# exatrain.launch.agent runs torchrun's agent with the job's python and torch, on each node (in the",
        "# container, if any): a torch older than exatrain's floor stops it there with a HINT.",
    ]
    if not job_signal:
        return lines
    return lines + [
        "# It forwards job.signal to the workers and waits the signal's lead time for their checkpoint:",
        "# with torchrun's --signals-to-handle/--shutdown-timeout where the node's torch has them (>= 2.12),",
        "# else itself (docs/torch-versions.md); the options are never named on a torch that lacks them.",
    ]
