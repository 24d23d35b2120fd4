"""docs/api.md's examples (its ```python blocks) run as written: the main loop as one process (twice: the second run resumes and
finds it complete), then every smaller example after it in the same script."""

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import clean_environment

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    script = cwd / "example.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script)], cwd=cwd, env=clean_environment(), capture_output=True,
                          text=True, timeout=600)


def test_main_example_trains_and_resumes(tmp_path):
    main = _blocks()[0]
    first = _run(main, tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "done: 24 steps" in first.stdout  # 3 epochs of 512 / 64 steps
    records = [json.loads(line) for line in (tmp_path / "runs/api-example/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 25)) and records[-1]["loss"] < records[0]["loss"]
    assert (tmp_path / "runs/api-example/model.pt").is_file()
    again = _run(main, tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resumed from" in again.stdout and "done: 24 steps" in again.stdout


def test_every_other_example_runs(tmp_path):
    blocks = _blocks()
    snippets = blocks[1:]  # (signatures are ```py blocks: not run)
    assert len(snippets) >= 5
    r = _run("\n".join([blocks[0].split("EPOCHS = 3")[0], *snippets]), tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
