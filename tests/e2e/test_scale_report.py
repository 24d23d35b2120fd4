"""`exatrain scale --nproc 1,2` then its report: Markdown tables that match the runs' own summaries, and an
HTML page that headless Chromium (Debian's package) loads without console messages and draws (a
screenshot that is not blank)."""

import json
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.e2e

STUDY = [
    "--train.steps=4",
    "--train.log_every=2",
    "--train.micro_batch_size=8",
    "--train.global_batch_size=16",
    "--train.eval_every=0",
    "--train.eval_at_start=false",
    "--train.eval_batches=1",
    "--data.seq_len=32",
]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    from tests.conftest import run_exatrain

    tmp = tmp_path_factory.mktemp("scale")
    r = run_exatrain(["scale", "--nproc=1,2", "--out=study", *STUDY], tmp)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return tmp / "study", r.stdout


def test_tables_match_the_runs(study):
    folder, stdout = study
    s = {n: json.loads((folder / f"nproc-{n}" / "summary.json").read_text()) for n in (1, 2)}
    assert s[1]["world_size"] == 1 and s[2]["world_size"] == 2
    speedup = s[2]["tokens_per_s"] / s[1]["tokens_per_s"]
    md = (folder / "report.md").read_text()
    assert f"| nproc-1 | 1 | {s[1]['tokens_per_s']:,.0f} | 1.00 | 100% |" in md
    assert f"| nproc-2 | 2 | {s[2]['tokens_per_s']:,.0f} | {speedup:.2f} | {speedup / 2:.0%} |" in md
    assert md in stdout  # the command prints the tables too


def test_report_of_given_runs_prints_the_same_tables(study, tmp_path):
    """`exatrain report RUN_DIR...` on the study's runs: the same Markdown tables as the study's own report,
    printed and written next to the page, then the `report:` line."""
    from tests.conftest import run_exatrain

    folder, _ = study
    runs = [str(folder / f"nproc-{n}") for n in (1, 2)]
    r = run_exatrain(["report", *runs, "--out=again.html"], tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    md = (tmp_path / "again.md").read_text()
    assert md == (folder / "report.md").read_text()
    assert r.stdout == md + "report: again.html (tables also in again.md)\n"
    assert (tmp_path / "again.html").read_text().count("<img ") == 4


@pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="Debian's chromium is not installed (scripts/test.sh installs it)",
)
def test_page_loads_and_draws_in_headless_chromium(study, tmp_path):
    from PIL import Image

    folder, _ = study
    page = folder / "report.html"
    assert (
        page.read_text().count("<img ") == 4
    )  # throughput, speedup/efficiency, loss, breakdown (no GPU here)
    shot = tmp_path / "shot.png"
    r = subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
            f"--screenshot={shot}",
            "--window-size=1280,1600",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and shot.exists(), r.stderr[-3000:]
    assert "CONSOLE" not in r.stderr, r.stderr  # no console message at all (errors included)
    img = Image.open(shot).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 20)
    not_white = sum(n for n, c in colours if c != (255, 255, 255)) / (img.width * img.height)
    assert len(colours) > 50 and not_white > 0.05, (len(colours), not_white)


def test_weak_mode_keeps_the_batch_per_rank(tmp_path):
    """--mode weak: every size trains the same batch per rank (the configured global batch at the smallest
    size), also when the global batch is given on the command line, as STUDY does."""
    import tomllib

    from tests.conftest import run_exatrain

    r = run_exatrain(
        ["scale", "--nproc=1,2", "--mode=weak", "--out=weak", *STUDY, "--train.steps=2"], tmp_path
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    batch = {}
    for n in (1, 2):
        run = tmp_path / "weak" / f"nproc-{n}"
        config = tomllib.loads((run / "config.toml").read_text())
        assert json.loads((run / "summary.json").read_text())["world_size"] == n
        batch[n] = config["train"]["global_batch_size"]
    assert batch == {1: 16, 2: 32}, batch
