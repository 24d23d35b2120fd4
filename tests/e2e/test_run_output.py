"""What `exatrain run` prints: no warning of its own at start or exit, every line of every rank whole (however
many ranks print at once, however a line is written), ``--label`` beginning each with its rank, and a
failure naming the rank that failed first with its last lines (issue 24, items 3 and 4)."""

import re
import subprocess
import sys

import pytest

from tests.conftest import clean_environment, run_exatrain
from tests.e2e.test_run import _slurm_task

pytestmark = pytest.mark.e2e

LINES = 1000
# Many short writes at once: print() under torchrun's `python -u` writes each argument and the newline apart.
PRINTS = (
    f"for i in range({LINES}):\n    print('rank', RANK, 'line', i, 'of', {{LINES}}, sep=' ')\n"
).replace("{LINES}", str(LINES))
COLLECTIVE = (
    "import os\nimport torch\nimport torch.distributed as dist\n\n"
    "dist.init_process_group('gloo')\nRANK = dist.get_rank()\n"
    "t = torch.ones(1) * (RANK + 1)\ndist.all_reduce(t)\nprint('sum', RANK, t.item())\n"
    + PRINTS
    + "dist.destroy_process_group()\n"
)
# Every warning shown once per place (DeprecationWarning too), FutureWarning an error: a false warning at
# exit, such as torch's deprecated alias touched by the script runner, would fail the rank.
WARNINGS = {"PYTHONWARNINGS": "default,error::FutureWarning"}


def _whole(out: str, ranks: int, label: bool) -> list[str]:
    """The lines of ``out`` that are not one intact line of the script (all of them, else)."""
    pattern = re.compile(rf"^(?:\[rank (\d)\] )?rank (\d) line (\d+) of {LINES}$")
    bad, seen = [], set()
    for line in out.splitlines():
        m = pattern.match(line)
        if not m or (label and m.group(1) != m.group(2)) or (not label and m.group(1)):
            bad.append(line)
        else:
            seen.add((int(m.group(2)), int(m.group(3))))
    missing = {(r, i) for r in range(ranks) for i in range(LINES)} - seen
    return bad + [f"missing: rank {r} line {i}" for r, i in sorted(missing)[:5]]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One `exatrain run --nproc 2 --label` of a gloo script that all-reduces and then prints LINES lines."""
    cwd = tmp_path_factory.mktemp("two_ranks")
    (cwd / "collective.py").write_text(COLLECTIVE)
    return run_exatrain(["run", "--nproc", "2", "--label", "collective.py"], cwd=cwd, env=WARNINGS)


def test_two_ranks_start_and_exit_without_a_warning(two_ranks):
    """No warning on stderr, and none raised with FutureWarning an error (-W error::FutureWarning)."""
    assert two_ranks.returncode == 0, two_ranks.stderr[-3000:]
    assert "[rank 0] sum 0 3.0" in two_ranks.stdout and "[rank 1] sum 1 3.0" in two_ranks.stdout
    assert "Warning" not in two_ranks.stderr, two_ranks.stderr


def test_two_ranks_printing_at_once_keep_every_line_whole_and_labelled(two_ranks):
    out = "\n".join(line for line in two_ranks.stdout.splitlines() if " sum " not in line)
    assert _whole(out, 2, label=True) == []


def test_four_ranks_lines_stay_whole_without_label(tmp_path):
    """Four workers on two cores, each printing LINES lines word by word at once; no torch in the script."""
    (tmp_path / "prints.py").write_text("import os\nRANK = int(os.environ['RANK'])\n" + PRINTS)
    r = run_exatrain(["run", "--nproc", "4", "prints.py"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert _whole(r.stdout, 4, label=False) == []


def test_the_rank_that_failed_first_is_named_with_its_last_lines(tmp_path):
    """Rank 1 fails while rank 0 waits (then ended by the agent): rank 1 is named as the first failure, with
    the last lines it wrote (its own and its traceback) recorded by the script runner in torchrun's error
    file."""
    (tmp_path / "fails.py").write_text(
        "import os, time\nrank = int(os.environ['RANK'])\nif rank == 1:\n    for i in range(30):\n"
        "        print('step', i, 'of rank', rank)\n    raise ValueError('bad batch in shard "
        "7')\ntime.sleep(60)\n"
    )
    r = run_exatrain(["run", "--nproc", "2", "fails.py"], cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    report = r.stderr.split("exatrain: error: ")[1]
    assert (
        report.startswith("rank 1 (local rank 1")
        and "failed first with exit code 1: ValueError: bad batch" in report
    )
    last = report.split("rank 1's last lines:\n")[1].split("HINT:")[0].splitlines()
    assert last[0] == "    step 24 of rank 1" and last[-1] == "    ValueError: bad batch in shard 7", report
    assert len(last) == 10


def test_srun_tasks_sharing_one_log_keep_lines_whole_and_labelled(tmp_path):
    """Two tasks under srun's variables (the rank wrapper execs the script runner) writing to one file at
    once, as the tasks of a job step write to one `--output` file (a stand-in for srun: without slurmstepd,
    which would itself gather each task's lines)."""
    (tmp_path / "prints.py").write_text("import os\nRANK = int(os.environ['RANK'])\n" + PRINTS)
    log = tmp_path / "job.out"
    with log.open("w") as out:
        tasks = [
            subprocess.Popen(
                [sys.executable, "-m", "exatrain.cli.main", "run", "--label", "prints.py"],
                cwd=tmp_path,
                env=clean_environment(_slurm_task(rank)),
                stdout=out,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in (0, 1)
        ]
        errors = [task.communicate(timeout=120)[1] for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], errors
    assert _whole(log.read_text(), 2, label=True) == []
