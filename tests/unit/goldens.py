"""One golden-file check for the sbatch rendering tests: compare, or (EXATRAIN_UPDATE_GOLDEN=1) rewrite and
fail, so a run that regenerated golden files can never pass."""

import os
from pathlib import Path

import pytest


def check_golden(path: Path, text: str) -> None:
    """Assert `text` equals the golden file at `path`; in update mode write it and fail the test."""
    if os.environ.get("EXATRAIN_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        pytest.fail(
            f"golden files rewritten; review the diff ({path.name}: git diff {path.parent}), then "
            "run again without EXATRAIN_UPDATE_GOLDEN"
        )
    assert path.is_file(), f"missing {path}: run with EXATRAIN_UPDATE_GOLDEN=1"
    assert text == path.read_text(), (
        f"{path.name} differs from the rendering (intended? see the module docstring)"
    )
