"""Stacks of an unmodified script (docs/hangs.md): plain_hang.py uses none of exatrain's API, so no
progress marks and no watcher; under `exatrain run --nproc 3` (no --hang-timeout: the default) the script
runner still records each rank's pid and dumps its stacks on SIGUSR1 (faulthandler). Rank 1 sleeps at step 3.

- the collective timeout (8 s) fires in ranks 0 and 2: one diagnosis names rank 1 and its line, instead of
  a traceback per rank; exit code 76;
- `exatrain dump RUN_DIR` on a run with a long timeout (and `--hang-timeout auto`, whose watcher never starts
  without marks) names rank 1 the same way, and, once rank 1 is stopped with SIGSTOP, reads its stack with
  py-spy.
Both runs start together so that their waits overlap."""

import json
import os
import signal
from pathlib import Path

import pytest

from exatrain.errors import EXIT_HANG
from tests.conftest import finish, run_exatrain, started_exatrain, wait_for

pytestmark = pytest.mark.dist

SCRIPT = Path(__file__).with_name("plain_hang.py")


def _line(marker: str) -> int:
    return next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1) if marker in line)


def _args(run_dir: Path, timeout_s: int, marker: Path, *hang: str) -> list[str]:
    return [
        "run",
        "--nproc=3",
        *hang,
        f"--run-dir={run_dir}",
        str(SCRIPT),
        str(timeout_s),
        str(marker),
    ]


def check_names_rank_1(text: str, others: str = "0,2") -> None:
    """The diagnosis names rank 1 at its stall line, and ranks `others` in all_reduce at theirs (also under
    mpirun: tests/e2e/test_mpi_hangs.py)."""
    stall, wait = f"plain_hang.py:{_line('STALL-LINE')} (main)", f"plain_hang.py:{_line('WAIT-LINE')} (main)"
    assert "rank 1 (" in text and "is outside any torch.distributed call, at " in text, text
    assert text.split("rank 1 (")[1].split(";")[0].count(stall) == 1, text
    assert f"rank(s) {others} wait in torch.distributed.all_reduce at {os.sep}" in text and wait in text, text


def test_a_collective_timeout_and_exatrain_dump_name_the_stalled_rank(tmp_path):
    env = {"OMP_NUM_THREADS": "1"}
    timed, dumped = tmp_path / "timed", tmp_path / "dumped"
    with started_exatrain(_args(timed, 8, tmp_path / "m1"), tmp_path, env) as timing:
        dump_args = _args(dumped, 300, tmp_path / "m2", "--hang-timeout=auto")
        with started_exatrain(dump_args, tmp_path, env) as running:
            wait_for(lambda: (tmp_path / "m2").exists(), 120, "rank 1 to stall", running)
            wait_for(
                lambda: len(list(dumped.glob("hang/attempt-0/pid-rank-*.json"))) == 3,
                10,
                "pid files",
                running,
            )
            r = run_exatrain(["dump", str(dumped)], tmp_path, timeout=60)
            assert r.returncode == 0, r.stdout + r.stderr
            assert r.stdout.startswith("exatrain: HANG (dump requested): ")
            check_names_rank_1(r.stdout)
            assert r.stdout.strip() == (dumped / "hang" / "diagnosis.txt").read_text().strip()
            # a stopped rank runs no signal handler: py-spy reads it
            pid = json.loads((dumped / "hang" / "attempt-0" / "pid-rank-1.json").read_text())["pid"]
            os.kill(pid, signal.SIGSTOP)
            try:
                r = run_exatrain(["dump", str(dumped)], tmp_path, timeout=60)
            finally:
                os.kill(pid, signal.SIGCONT)
            assert r.returncode == 0, r.stdout + r.stderr
            check_names_rank_1(r.stdout)
            stacks = (dumped / "hang" / "attempt-0" / "stacks-rank-1.txt").read_text()
            assert "Thread " in stacks and f"plain_hang.py:{_line('STALL-LINE')})" in stacks, stacks
        code, out, err = finish(timing, timeout=180)
    assert code == EXIT_HANG, out[-2000:] + err[-3000:]
    diagnosis = (timed / "hang" / "diagnosis.txt").read_text().strip()
    assert diagnosis.startswith("exatrain: HANG (a collective timed out in rank ")
    check_names_rank_1(diagnosis)
    assert err.count(diagnosis) == 1 and "Traceback" not in err, err[-3000:]
    for rank in (0, 2):  # the ranks that timed out keep their traceback on disk
        stacks = (timed / "hang" / "attempt-0" / f"timeout-rank-{rank}.txt").read_text()
        assert "Collective timeout in rank" in stacks and "distributed_c10d.py" in stacks, stacks


def test_dump_without_recorded_ranks_says_how_to_get_them(tmp_path):
    r = run_exatrain(["dump", str(tmp_path)], tmp_path, timeout=60)
    assert r.returncode == 2 and "no ranks recorded in its hang/ folder" in r.stderr, r.stderr
    assert "\nHINT: start the job with `exatrain run" in r.stderr


def test_every_run_records_its_ranks_unless_hang_timeout_is_0(tmp_path):
    """`exatrain run` without --hang-timeout records each rank's pid (what `exatrain dump` and the collective
    timeout's diagnosis need); `--hang-timeout 0` writes nothing; a run directory that cannot be made costs
    the dumps, with one note, not the run."""
    script = tmp_path / "quick.py"
    script.write_text("import os\nprint('rank', os.environ['RANK'], 'done')\n")
    for hang, run_dir in (((), "default"), (("--hang-timeout", "0"), "off"), ((), "a-file/run")):
        (tmp_path / "a-file").write_text("not a directory\n")
        args = ["run", "--nproc", "2", *hang, "--run-dir", str(tmp_path / run_dir), str(script)]
        r = run_exatrain(args, tmp_path, timeout=120)
        assert r.returncode == 0 and "rank 1 done" in r.stdout, r.stdout + r.stderr
        records = sorted(p.name for p in tmp_path.glob(f"{run_dir}/hang/attempt-0/pid-rank-*.json"))
        if run_dir == "default":
            assert records == ["pid-rank-0.json", "pid-rank-1.json"], records
        elif run_dir == "off":
            assert not (tmp_path / "off").exists()
        else:
            assert r.stderr.count("exatrain: note: no stack dumps for this run (") == 1, r.stderr
