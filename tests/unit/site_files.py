"""A copy of a bundled site profile with another [hardware] table, for tests of `exatrain plan --time`."""

import re
from pathlib import Path

from exatrain.slurm.profiles import PROFILE_DIR


def site_with_hardware(tmp_path: Path, base: str = "juwels-booster", **hardware) -> str:
    """Write profile `base` with its [hardware] table replaced by `hardware` (no table when empty) and return
    the file's path."""
    text = (PROFILE_DIR / f"{base}.toml").read_text()
    # the table runs from its header to the next header; comments and blank lines inside it go with it
    text, n = re.subn(r"^\[hardware\]\n(?:(?!\[).*\n)*", "", text, flags=re.M)
    assert n == 1, f"{base}.toml has no [hardware] table"
    if hardware:
        text += "\n[hardware]\n" + "".join(f"{k} = {v!r}\n" for k, v in hardware.items())
    path = tmp_path / "site.toml"
    path.write_text(text)
    return str(path)
