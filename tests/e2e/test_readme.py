"""The commands of README.md and of every page of the documentation site (docs/**/*.md) as a new user runs
them.

- The main command (install, then `exatrain train` with no arguments) runs in full from the repository root.
- EVERY other fenced ```bash block of README.md and docs/ runs too, block by block (each in a fresh folder
  with `.venv` and `examples` linked in and `.venv/bin` on PATH, as after `source .venv/bin/activate`; the
  ```toml blocks of the same page whose first line is `# NAME.toml` written there as NAME.toml), so no
  documented command can rot. To keep CI short,
  each `exatrain train` command gets FAST_TRAIN appended for every key it does not set itself (smaller
  windows and evaluations, and 6 steps unless the block names a checkpoint `step-N` of the documented
  step count); everything the command says itself stays as written. (Measured on a loaded 2-core machine:
  the 4- and 8-rank blocks took 3 and 9 minutes at the default 300 steps.)
- Convention: a block that cannot run in CI (it needs a SLURM cluster, data from the internet, or it is CI
  itself) is preceded by an HTML comment line `<!-- not-in-ci: REASON -->` directly above its fence; the
  reason should name the test that covers it instead, where one does.
- A block preceded by `<!-- twin: SITE -->` (the site guides, docs/sites/*.md) is not run here either: it
  runs in page order on that site's twin of the SLURM test cluster (tests/slurm/test_site_guides.py).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, clean_environment

pytestmark = pytest.mark.e2e

FAST_TRAIN = {
    "--data.seq_len": "16",
    "--train.eval_batches": "2",
    "--train.eval_every": "0",
    "--train.log_every": "50",
}
BLOCK = re.compile(
    r"(<!-- (?:not-in-ci|(?P<twin>twin)): (?P<reason>.+?) -->\n)?```(?P<lang>bash|toml)\n(?P<body>.*?)\n```",
    re.S,
)
HOW_TO_MARK = (
    "if this block cannot run in CI (SLURM cluster, internet data), put the line "
    "`<!-- not-in-ci: REASON -->` directly above its ```bash fence in its page"
)
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]


def _blocks(page: str | None = None) -> list[dict]:
    """The fenced bash/toml blocks of one page (or of every page), each with the page it is on."""
    return [
        {**m.groupdict(), "page": name}
        for name in ([page] if page else PAGES)
        for m in BLOCK.finditer((ROOT / name).read_text())
    ]


def _files(page: str) -> dict[str, str]:
    """The ```toml blocks of a page that name their file on the first line (`# run.toml`)."""
    found = {}
    for b in _blocks(page):
        first = b["body"].splitlines()[0]
        if b["lang"] == "toml" and re.fullmatch(r"# [\w.-]+\.toml", first):
            found[first[2:]] = b["body"] + "\n"
    return found


def _commands(body: str) -> list[str]:
    """The commands of a block: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def _fast(command: str, block: str) -> str:
    if "exatrain train" not in command:
        return command
    fast = FAST_TRAIN if "checkpoints/step-" in block else {**FAST_TRAIN, "--train.steps": "6"}
    extra = [f"{k}={v}" for k, v in fast.items() if f"{k}=" not in command]
    return " ".join([command, *extra])


RUNNABLE = [b for b in _blocks() if b["lang"] == "bash" and not b["reason"]]


def test_readme_has_exactly_the_two_setup_commands():
    setup = (ROOT / "README.md").read_text().split("## Set up", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.+?)\n```", setup, re.S)
    assert blocks == ["bash scripts/install.sh && .venv/bin/exatrain train", "bash scripts/test.sh"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in ci


def _fresh_checkout(folder):
    """The repository's tracked files (as a clone has them) in ``folder``, with an empty venv in its `.venv`
    whose path already holds torch and exatrain's other dependencies (tests/e2e/plain_venv.py's folder of
    links; install.sh keeps a venv's torch, as on a cluster's site torch): install.sh then really installs
    exatrain there, without downloading torch again."""
    from tests.e2e.plain_venv import core_closure, link_farm

    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (ROOT / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes((ROOT / name).read_bytes())
    subprocess.run([sys.executable, "-m", "venv", str(folder / ".venv")], check=True)
    link_farm(folder.parent / "deps", core_closure())
    site = subprocess.run(
        [
            str(folder / ".venv" / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "site_deps.pth").write_text(f"{folder.parent / 'deps'}\n")


def test_main_command_trains_and_cuts_perplexity(tmp_path):
    main = [b["body"] for b in _blocks() if b["lang"] == "bash"][0]
    repo = tmp_path / "exatrain"
    _fresh_checkout(repo)
    # the README command as written, run from the root of a fresh checkout (where a new user runs it)
    r = subprocess.run(
        ["bash", "-c", main],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=900,
        env=clean_environment(None),
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "install: exatrain\n" in r.stdout and "already installed" not in r.stdout, r.stdout[:2000]
    assert "validation perplexity" in r.stdout
    summary = json.loads((repo / "runs" / "default" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["weights_in_sync"]
    start, end = summary["initial_eval"]["perplexity"], summary["final_eval"]["perplexity"]
    assert end < start / 5, f"perplexity {start:.1f} -> {end:.1f}: not well below the untrained model's"


def test_every_bash_block_is_run_or_marked_with_a_reason():
    """The setup blocks are marked (one is run in full above, the other is CI itself); the rest is sorted
    into blocks that run below and blocks marked not-in-ci with a non-empty reason."""
    bash = [b for b in _blocks() if b["lang"] == "bash"]
    assert len(bash) >= 8 and len(RUNNABLE) >= 5, "the pages lost their commands, or this test its parser"
    assert all(b["reason"].strip() for b in bash if b["reason"] is not None)
    readme = [b for b in bash if b["page"] == "README.md"]
    assert [b["body"] for b in readme[:2] if b["reason"]] == [b["body"] for b in readme[:2]], (
        "the two setup commands are marked (run by test_main_command_..., and CI itself)"
    )


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: f"{b['page']}:{_commands(b['body'])[0][:60]}")
def test_readme_block_runs(block, tmp_path):
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    (tmp_path / "examples").symlink_to(
        ROOT / "examples"
    )  # the examples' commands name them from the repository root
    for name, text in _files(block["page"]).items():
        (tmp_path / name).write_text(text)
    env = clean_environment(None)
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    outputs = []
    for command in _commands(block["body"]):
        run_as = _fast(command, block["body"])
        r = subprocess.run(
            ["bash", "-c", run_as], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert r.returncode == 0, (
            f"{block['page']}: command failed: {command}\n(run as: {run_as})\n"
            f"{r.stdout[-2000:]}\n{r.stderr[-3000:]}\nHINT: fix the command or the code; "
            f"{HOW_TO_MARK}"
        )
        outputs.append(r.stdout + r.stderr)
    for marker, check in PROMISES.items():
        if marker in block["body"]:
            check(tmp_path, outputs)


def _checkpoint_block(folder, outputs):
    """Checkpoints and resuming: step-50, step-100, ... written (the newest 3 kept, checkpoint.keep's
    default); the 1-rank run continues from step-300 and trains on to step 400; the export writes model.pt.
    (The elastic command is a block of its own; tests/distributed/test_elastic.py kills a worker under it.)"""
    first, resumed, exported = outputs
    assert all(f"checkpoints/step-{n} committed" in first for n in range(50, 301, 50)), first[-2000:]
    assert "resumed from" in resumed and "at step 300" in resumed, resumed[-2000:]
    kept = sorted(p.name for p in (folder / "runs" / "default" / "checkpoints").glob("step-*"))
    assert kept == ["step-300", "step-350", "step-400"]
    assert json.loads((folder / "runs" / "default" / "summary.json").read_text())["world_size"] == 1
    assert (folder / "model.pt").stat().st_size > 0


# What a block promises beyond its exit status, checked after it ran (keyed by a text only that block has).
PROMISES = {"--checkpoint.resume=auto --train.steps=400": _checkpoint_block}
