"""Progress output on rank 0: a rich progress bar in a terminal, plain lines in logs and pipes."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class ProgressReporter:
    """Reports training steps and evaluations. Silent on every rank but 0."""

    def __init__(self, total_steps: int, enabled: bool, log_every: int, stream=None):
        self.total, self.enabled, self.log_every = total_steps, enabled, max(1, log_every)
        stream = stream or sys.stdout
        self.console = Console(file=stream)
        self.bar: Progress | None = None
        if enabled and stream.isatty():
            self.bar = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"), TimeRemainingColumn(), console=self.console,
            )
            self.task = self.bar.add_task("train", total=total_steps, status="")
            self.bar.start()

    def step(self, step: int, loss: float, lr: float, tokens_per_s: float) -> None:
        """Show one optimizer step (every step on the bar, every `log_every` steps as a line)."""
        if not self.enabled:
            return
        status = f"loss {loss:.4f} | lr {lr:.2e} | {tokens_per_s:,.0f} tok/s"
        if self.bar is not None:
            self.bar.update(self.task, completed=step, status=status)
        elif step % self.log_every == 0 or step == self.total:
            self.line(f"step {step:>6}/{self.total} | {status}")

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
