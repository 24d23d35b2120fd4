"""TensorBoard event files of a run (RUN_DIR/tensorboard), written on rank 0 with the `tensorboard` package.

Uses torch.utils.tensorboard.SummaryWriter (which writes through the tensorboard package's event-file
writer). The package is a dependency of exatrain (a site's own environment may still lack it: then
"auto" writes nothing and "on" is refused at start).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from exatrain.config.validate import check_choice
from exatrain.errors import ExatrainError
from exatrain.observe.progress import flagged_text


def tensorboard_available() -> bool:
    """Whether the tensorboard package is installed (observe.tensorboard = "auto" writes only then)."""
    return importlib.util.find_spec("tensorboard") is not None


def wants_tensorboard(setting: str) -> bool:
    """Resolve observe.tensorboard (auto, on, off); "on" without the package is an error with a HINT."""
    check_choice("observe.tensorboard", setting, ("auto", "on", "off"))
    if setting == "off":
        return False
    if setting == "on" and not tensorboard_available():
        raise ExatrainError(
            "observe.tensorboard = on, but the tensorboard package is not installed",
            "pip install tensorboard (a dependency of exatrain: `pip install exatrain` installs it; "
            "or set observe.tensorboard = auto)",
        )
    return tensorboard_available()


class TensorBoardLog:
    """Scalars of each metrics record as TensorBoard series `<kind>/<name>` (e.g. train/loss)."""

    def __init__(self, log_dir: str | Path, enabled: bool = True):
        self.writer = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, kind: str = "train", step: int = 0, **values) -> None:
        """Add every numeric value of one record at `step`, and a flagged straggler as the text
        `<kind>/straggler_flagged` (TensorBoard's Text tab); None, other text and booleans are skipped."""
        if self.writer is None:
            return
        for name, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(f"{kind}/{name}", value, step)
        if values.get("straggler_flagged"):
            text = "STRAGGLER flagged: " + flagged_text(values["straggler_flagged"])
            self.writer.add_text(f"{kind}/straggler_flagged", text, step)

    def flush(self) -> None:
        """Make what was written so far visible to readers (TensorBoard itself flushes every 2 minutes)."""
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
