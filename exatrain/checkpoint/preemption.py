"""Pre-timeout and preemption signals: finish the step, checkpoint, requeue.

SLURM sends the configured signal (`--signal=USR2@120`; USR2 by default because NCCL may use USR1)
before the time limit, and some sites send only SIGTERM before killing a job. The handler just sets a
flag; the trainer checks it after every step, on all ranks together, so every rank stops at the same step
(on GPUs one step after the signal: the check never makes the host wait for the running step, see
exatrain.distributed.collectives.LaggedAnyRank).
"""

from __future__ import annotations

import signal
from pathlib import Path

import torch

from exatrain.distributed.collectives import LaggedAnyRank
from exatrain.errors import ConfigError
from exatrain.slurm.requeue import EXIT_REQUEUE, REQUEUE_MARKER


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
        """Collective: did any rank receive a signal? (one tiny all-reduce; all ranks must call it). On GPUs
        the answer is the previous call's, so that the check does not wait for the step that was just
        queued."""
        return self._any_rank(self.received is not None, device)

    def restore(self) -> None:
        """Put back the previous handlers."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _signal(name: str) -> signal.Signals:
    key = name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()
    try:
        return signal.Signals[key]
    except KeyError:
        raise ConfigError(
            f"checkpoint.signals: unknown signal {name!r}", "use names such as USR2, TERM, USR1"
        ) from None


def handled_signals(setting: str, kind: str, in_slurm_job: bool) -> tuple[str, ...]:
    """The checkpoint.signals a rank handles. Under torchrun outside SLURM, TERM is left to its default: the
    agent stops the surviving workers with TERM when one fails, and catching it would keep them in a
    collective with the dead rank until the agent's kill timeout. In a SLURM job TERM is also SLURM's
    preemption notice (and the agent forwards TERM it receives), so it is handled there."""
    names = [n.strip().upper().removeprefix("SIG") for n in setting.split(",") if n.strip()]
    if kind == "torchelastic" and not in_slurm_job:
        names = [n for n in names if n != "TERM"]
    return tuple(names)


def request_requeue(run_dir: Path, under_torchrun: bool) -> str:
    """Leave RUN_DIR/requeue-requested for whoever started the ranks (the batch script requeues the job,
    `exatrain train --nproc` exits 75); returns the line to print. Call on one rank, after the commit."""
    (run_dir / REQUEUE_MARKER).write_text(
        "checkpoint committed; requeue or restart with --checkpoint.resume=auto\n"
    )
    how = "torchrun's agent exits 1 after a signal, so" if under_torchrun else f"exit code {EXIT_REQUEUE};"
    return (
        f"could not requeue from here: {how} {run_dir / REQUEUE_MARKER} tells the batch script to requeue "
        "(outside SLURM: restart with --checkpoint.resume=auto)"
    )
