"""Progress output on rank 0: a rich progress bar in a terminal, plain lines in logs and pipes."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

from exatrain.observe.rank import is_rank0


class Progress:
    """Shows training steps: `step(n, loss=..., ...)`. Silent on every rank but 0.

    In a terminal a live bar updated every step; otherwise (logs, pipes) a line every `log_every` steps
    and at the last step.
    """

    def __init__(self, total_steps: int, enabled: bool | None = None, log_every: int = 1, stream=None):
        self.total, self.log_every = total_steps, max(1, log_every)
        self.enabled = is_rank0() if enabled is None else enabled
        stream = stream or sys.stdout
        self.console = Console(file=stream)
        self.bar: RichProgress | None = None
        if self.enabled and stream.isatty():
            self.bar = RichProgress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self.task = self.bar.add_task("train", total=total_steps, status="")
            self.bar.start()

    def step(self, step: int, **values) -> None:
        """Show step `step` with its values, e.g. step(10, loss=2.31, lr=1e-3)."""
        self._show(step, " | ".join(f"{k} {_fmt(v)}" for k, v in values.items()))

    def _show(self, step: int, status: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(self.task, completed=step, status=status)
        elif step % self.log_every == 0 or step == self.total:
            self.line(f"step {step:>6}/{self.total}" + (f" | {status}" if status else ""))

    def line(self, text: str) -> None:
        """A plain message (above the bar in a terminal)."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.console.file, flush=True)

    def close(self) -> None:
        """Stop the live bar, if any."""
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


class ProgressReporter(Progress):
    """The reference trainer's progress: loss, learning rate and throughput per step."""

    def __init__(
        self,
        total_steps: int,
        enabled: bool,
        log_every: int,
        stream=None,
        straggler_ratio: float | None = None,
    ):
        super().__init__(total_steps, enabled, log_every, stream)
        self.straggler_ratio = STRAGGLER_RATIO if straggler_ratio is None else straggler_ratio

    def step(
        self, step: int, loss: float, lr: float, tokens_per_s: float, record: dict | None = None
    ) -> None:
        """Show one optimizer step (every step on the bar, every `log_every` steps as a line); with a
        StepMetrics `record`, also MFU (when known), the step-time breakdown and the rank skew."""
        text = f"loss {loss:.4f} | lr {lr:.2e} | {tokens_per_s:,.0f} tok/s"
        self._show(step, text + (breakdown(record, self.straggler_ratio) if record else ""))


def breakdown(r: dict, straggler_ratio: float | None = None) -> str:
    """' | MFU 41.0% | step 0.48 s = data 0.00 + fwd/bwd 0.42 + opt 0.01 + ckpt 0.00 | skew 0.005 s (rank
    1)'."""
    mfu = f" | MFU {r['mfu']:.1%}" if r.get("mfu") is not None else ""
    mem = f" | peak {r['peak_mem_gib']:.1f} GiB" if r.get("peak_mem_gib") is not None else ""
    return (
        f"{mfu}{mem} | step {r['step_s']:.2f} s = data {r['time_data_s']:.2f} + fwd/bwd "
        f"{r['time_forward_backward_s']:.2f} + opt {r['time_optimizer_s']:.2f} + ckpt "
        f"{r['time_checkpoint_s']:.2f}"
        f" | skew {r['rank_skew_s']:.3f} s (rank {r['slowest_rank']})"
        + _straggler(r, straggler_ratio or STRAGGLER_RATIO)
        + flagged(r)
    )


#: a straggler slows the job's steps by this factor or more before the progress line names it (the default
#: of observe.straggler_ratio)
STRAGGLER_RATIO = 1.2


def _straggler(r: dict, ratio: float) -> str:
    """' | straggler rank 3 (data, x1.35)' when one rank's host phase slows every step by `ratio` or more."""
    if r.get("straggler_rank") is None or r.get("straggler_ratio", 1.0) < ratio:
        return ""
    return f" | straggler rank {r['straggler_rank']} ({r['straggler_phase']}, x{r['straggler_ratio']:.2f})"


def flagged_text(f: dict) -> str:
    """'rank 1 on nid005012 (GPU 3), data x1.52 for 3 intervals': one flagged straggler (StepMetrics)."""
    return (
        f"rank {f['rank']} on {f['host']} ({f['device']}), {f['phase']} x{f['ratio']:.2f} for "
        f"{f['intervals']} intervals"
    )


def flagged(r: dict) -> str:
    """' | STRAGGLER flagged: rank 1 on nid005012 (GPU 3), data x1.52 for 3 intervals' on the record that
    flags one (StepMetrics), else ''."""
    f = r.get("straggler_flagged")
    if not f:
        return ""
    return f" | STRAGGLER flagged: {flagged_text(f)}"


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
