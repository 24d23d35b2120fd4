"""docs/api.md's examples (its ```python blocks) run as written: the main loop as one process (twice: the
second run resumes and finds it complete), then every smaller example after it in the same script; and every
public name of `import exatrain` is documented there with an example that runs."""

import json
import re
import subprocess
import sys
from pathlib import Path

import exatrain
from tests.conftest import clean_environment

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
#: public names whose example is a ```py block this file does not run, and why
NOT_RUN_HERE = {
    "init_deepspeed": "needs the deepspeed extra",
    "attach_deepspeed": "needs the deepspeed extra",
    "init_horovod": "needs horovod (scripts/install.sh horovod)",
    "Pipeline": "needs two ranks: tests/distributed/test_api_public.py runs its example",
}


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    script = cwd / "example.py"
    script.write_text(code)
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=cwd,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_main_example_trains_and_resumes(tmp_path):
    main = _blocks()[0]
    first = _run(main, tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "done: 24 steps" in first.stdout  # 3 epochs of 512 / 64 steps
    records = [
        json.loads(line) for line in (tmp_path / "runs/api-example/metrics.jsonl").read_text().splitlines()
    ]
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
    assert "HINT: call init() once" in r.stdout  # the second init() raised ExatrainError
    assert (
        "pp 1 x dp_replicate 2 x dp_shard 4 x tp 2 (HSDP, TP)" in r.stdout
    )  # ParallelDims, as the comment says
    # StepMetrics: 512 samples / 64 per step = 8 steps, a record on log steps 4 and 8 only
    records = [
        json.loads(line)
        for line in (tmp_path / "runs/step-metrics-demo/metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in records] == [4, 8]
    assert all(r["kind"] == "train" and r["loss"] > 0 and r["samples_per_s"] > 0 for r in records)


def test_every_public_name_is_documented_with_an_example():
    """docs/api.md names each of `exatrain.__all__` as `exatrain.NAME`, and uses it in a ```python block that
    the tests above run (except the few in NOT_RUN_HERE, each in a ```py example)."""
    text = DOC.read_text()
    run = "\n".join(_blocks())
    not_run = "\n".join(re.findall(r"```py\n(.*?)```", text, flags=re.S))
    for name in exatrain.__all__:
        assert f"exatrain.{name}" in text, f"docs/api.md does not name exatrain.{name}"
        used = re.compile(rf"\bexatrain\.{re.escape(name)}\b")
        if name in NOT_RUN_HERE:
            assert used.search(not_run), f"docs/api.md has no example of exatrain.{name}"
        else:
            assert used.search(run), f"no ```python example in docs/api.md uses exatrain.{name}"
