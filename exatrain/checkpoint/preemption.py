"""Pre-timeout and preemption signals: finish the step, checkpoint, requeue.

SLURM sends the configured signal (`--signal=USR2@120`; USR2 by default because NCCL may use USR1)
before the time limit, and some sites send only SIGTERM before killing a job. The handler just sets a
flag; the trainer checks it after every step, on all ranks together, so every rank stops at the same step
(on GPUs one step after the signal: the check never makes the host wait for the running step, see
exatrain.distributed.collectives.LaggedAnyRank).
"""

from __future__ import annotations

import signal

import torch

from exatrain.distributed.collectives import LaggedAnyRank
from exatrain.errors import ConfigError


class PreemptionFlag:
    """Set by the given signals; `agreed()` is True on every rank once any rank got one."""

    def __init__(self, names: tuple[str, ...]):
        self.received: str | None = None
        self._previous = {}
        self._any_rank = LaggedAnyRank()
        for name in names:
            sig = _signal(name)
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name

    def agreed(self, device: torch.device) -> bool:
        """Collective: did any rank receive a signal? (one tiny all-reduce; all ranks must call it). On GPUs the
        answer is the previous call's, so that the check does not wait for the step that was just queued."""
        return self._any_rank(self.received is not None, device)

    def restore(self) -> None:
        """Put back the previous handlers."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def preemption_signals(setting: str, launcher_kind: str) -> tuple[str, ...]:
    """The signal names of a setting like "USR2,TERM" that mean "time is up" under this launcher.

    Under torchrun, TERM is left out: its agent stops the surviving workers with SIGTERM when one fails,
    and catching it would keep them alive, blocked in a collective with the dead rank, until the agent's
    kill timeout."""
    names = [n.strip().upper().removeprefix("SIG") for n in setting.split(",") if n.strip()]
    if launcher_kind == "torchelastic":
        names = [n for n in names if n != "TERM"]
    return tuple(names)


def _signal(name: str) -> signal.Signals:
    key = name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()
    try:
        return signal.Signals[key]
    except KeyError:
        raise ConfigError(f"checkpoint.signals: unknown signal {name!r}", "use names such as USR2, TERM, USR1") from None
