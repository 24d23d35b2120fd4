"""A plain ``pip install .`` (no extra) runs the README's main commands: `exatrain scale` trains every run
and writes its report with the plots drawn, every run writes TensorBoard event files, `exatrain run` starts
a script's ranks; a command that needs an extra refuses at start with a HINT naming it (issue 24, item 6).
The venv is built by tests/e2e/plain_venv.py (see there what it does not reproduce)."""

import subprocess
import sys

import pytest

from tests.conftest import clean_environment
from tests.e2e.plain_venv import core_closure, make_plain_venv
from tests.e2e.test_scale_report import STUDY

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """(the plain venv's bin folder, a working directory outside the source tree)."""
    folder = tmp_path_factory.mktemp("plain")
    python = make_plain_venv(folder)
    work = folder / "work"
    work.mkdir()
    return python.parent, work


def _run(plain, *args, timeout=600):
    bin_dir, work = plain
    return subprocess.run(
        [str(bin_dir / "exatrain"), *args],
        cwd=work,
        env=clean_environment(),
        text=True,
        capture_output=True,
        timeout=timeout,
    )


def test_the_plain_venv_holds_no_extra():
    names = set(core_closure())
    assert {"torch", "tensorboard", "matplotlib"} <= names
    assert not names & {"deepspeed", "pytest", "amdsmi", "nvidia-ml-py", "torchvision", "transformers"}


def test_scale_trains_and_writes_its_report_with_plots_and_tensorboard_files(plain):
    r = _run(plain, "scale", "--nproc=1", "--out=study", *STUDY)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    study = plain[1] / "study"
    assert "data:image/png;base64," in (study / "report.html").read_text()
    assert list((study / "nproc-1" / "tensorboard").glob("events.out.tfevents.*"))


def test_run_starts_a_scripts_ranks(plain):
    (plain[1] / "show.py").write_text(
        "import os\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\n"
    )
    r = _run(plain, "run", "--nproc", "2", "show.py")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["rank 0 of 2", "rank 1 of 2"]


def test_an_engine_from_an_extra_is_refused_at_start_with_a_hint_naming_it(plain):
    r = _run(plain, "train", "--nproc", "1", "--engine.name=deepspeed", "--train.steps=2", "--run.dir=ds")
    assert r.returncode != 0
    assert "DeepSpeed is not installed" in r.stderr and "HINT: pip install 'exatrain[deepspeed]'" in r.stderr
    assert "Traceback" not in r.stderr and not (plain[1] / "ds" / "metrics.jsonl").exists()


def test_scale_without_matplotlib_is_refused_before_its_first_run(tmp_path):
    """An environment without matplotlib (a site's venv built with --no-deps, say; hidden here through
    sys.modules, as the import system honours): the study stops at start instead of after training."""
    code = (
        "import sys\nsys.modules['matplotlib'] = None\nfrom exatrain.cli.main import main\n"
        "sys.argv = ['exatrain', 'scale', '--nproc=1', '--out=study']\nsys.exit(main())\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=clean_environment(),
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert r.returncode != 0 and "not installed" in r.stderr and "HINT: pip install matplotlib" in r.stderr, (
        r.stderr
    )
    assert not (tmp_path / "study").exists()
