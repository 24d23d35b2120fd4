"""The README's main command, as a new user runs it: install, then `exatrain train` with no arguments."""

import json
import re
import subprocess

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e


def _commands():
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_has_exactly_the_two_setup_commands():
    setup = (ROOT / "README.md").read_text().split("## Set up", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.+?)\n```", setup, re.S)
    assert blocks == ["bash scripts/install.sh && .venv/bin/exatrain train", "bash scripts/test.sh"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in ci


def test_main_command_trains_and_cuts_perplexity():
    main = _commands()[0]
    # the README command as written, run from the repository root (where a new user runs it)
    r = subprocess.run(["bash", "-c", main], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "validation perplexity" in r.stdout
    summary = json.loads((ROOT / "runs" / "default" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["weights_in_sync"]
    start, end = summary["initial_eval"]["perplexity"], summary["final_eval"]["perplexity"]
    assert end < start / 5, f"perplexity {start:.1f} -> {end:.1f}: not well below the untrained model's"
