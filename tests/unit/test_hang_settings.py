"""Hang watch settings and wording without a hang (docs/hangs.md): bad timeouts are refused at start with a
HINT, and the diagnosis names the right rank from the watchers' reports (the real thing:
tests/distributed/test_hangs.py)."""

import time
from pathlib import Path

import pytest

from exatrain.cli.main import main
from exatrain.observe import heartbeat
from exatrain.observe.hang_report import diagnose, pyspy_frames, stall_frame

SCRIPT = str(Path(__file__).resolve().parents[1] / "distributed" / "hang_loop.py")


def test_a_timeout_below_two_seconds_is_refused(capsys):
    assert main(["run", "--hang-timeout", "1", SCRIPT, "sleep"]) == 2
    err = capsys.readouterr().err
    assert "--hang-timeout = 1 s: a hang timeout must be at least 2 s" in err and "\nHINT: " in err


def test_a_timeout_not_below_the_time_left_of_the_job_is_refused(capsys, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(time.time()) + 120))
    assert main(["run", "--nproc", "2", "--hang-timeout", "600", SCRIPT, "sleep"]) == 2
    err = capsys.readouterr().err
    assert "--hang-timeout = 600 s is not shorter than the time left of this SLURM job" in err
    assert "\nHINT: choose a hang timeout well below" in err


def test_a_submitted_job_whose_time_limit_the_hang_timeout_exceeds_is_refused(capsys):
    assert main(["sbatch", "--run.hang_timeout_s=7200", "--job.time=60"]) == 2
    err = capsys.readouterr().err
    assert "run.hang_timeout_s = 7200 s is not shorter than job.time 60 (3600 s)" in err and "\nHINT: " in err


def test_the_trainer_refuses_a_bad_timeout_before_starting(capsys, tmp_path):
    assert main(["train", "--nproc", "2", "--run.hang_timeout_s=0.5", f"--run.dir={tmp_path}"]) == 2
    assert "run.hang_timeout_s = 0.5 s" in capsys.readouterr().err


def _report(step, enqueued, completed, where="train.py:5 (main)", stalled=25.0):
    return {
        "host": "nid1",
        "pid": 10,
        "step": step,
        "phase": "step",
        "stalled_s": stalled,
        "where": where,
        "collective": {"op": "gloo:all_reduce", "enqueued": enqueued, "completed": completed},
    }


def test_the_rank_that_never_entered_the_collective_is_named():
    reports = {0: _report(7, 7, 6), 1: _report(7, 7, 6), 2: _report(7, 6, 6, "train.py:9 (stall)")}
    text = diagnose(reports, {}, 3, 20)
    assert text.startswith(
        "exatrain: HANG (no progress for over 20 s): rank 2 (nid1, pid 10) has made no "
        "progress for 25 s at step 7 in phase step at train.py:9 (stall); rank(s) 0,1 wait in "
        "gloo:all_reduce #7, which rank(s) 2 never entered"
    )


def test_without_a_flight_recorder_the_rank_behind_is_named_and_a_silent_rank_mentioned():
    reports = {
        0: {**_report(8, 0, 0), "collective": None},
        1: {**_report(7, 0, 0, "x.py:3 (f)"), "collective": None},
    }
    text = diagnose(reports, {}, 3, 20)
    assert "rank 1 (nid1, pid 10) has made no progress for 25 s at step 7" in text and "rank 0 (" not in text
    assert "no report from rank(s) 2" in text


def test_a_stopped_rank_is_named_first():
    stopped = {
        3: {"host": "nid2", "pid": 7, "step": 4, "phase": "data", "silent_s": 30.0, "where": "t.py:1 (g)"}
    }
    text = diagnose({0: _report(5, 5, 4)}, stopped, 4, 20)
    assert "rank 3 (nid2, pid 7) stopped beating 30 s ago" in text and "stands at t.py:1 (g)" in text
    assert "rank(s) 0 wait in gloo:all_reduce #5" in text


def test_a_lone_rank_stuck_with_its_collective_queued_is_named_with_its_gpu_and_that_collective():
    """One rank whose GPU never finishes (a kernel that does not end): the flight recorder shows its
    all_reduce queued and not completed; the diagnosis says so, and names the node's GPU number."""
    rep = {**_report(5, 5, 4, "loop.py:20 (main)"), "device": "GPU 3"}
    rep["collective"]["op"] = "nccl:all_reduce"
    text = diagnose({0: rep}, {}, 1, 10)
    assert text == (
        "exatrain: HANG (no progress for over 10 s): rank 0 (nid1, GPU 3, pid 10) has made no progress "
        "for 25 s at step 5 in phase step at loop.py:20 (main), with its nccl:all_reduce #5 queued and "
        "not completed."
    )


def test_the_stall_line_is_the_users_frame_not_a_library_one():
    import threading

    lib = threading.__file__
    frames = [(lib, 10, "wait"), ("/home/me/train.py", 88, "main"), (lib, 1, "run")]
    assert stall_frame(frames) == ("/home/me/train.py", 88, "main")
    assert stall_frame([(lib, 10, "wait")]) == (lib, 10, "wait")


def test_py_spy_frames_of_the_main_thread_are_read_innermost_first():
    # the shape of `py-spy dump --full-filenames` output (py-spy
    # 0.4.3, as tests/distributed/test_hangs.py runs it)
    text = (
        'Process 5: python x.py\nPython v3.11.7\n\nThread 5 (idle): "MainThread"\n'
        "    stall (/home/me/x.py:23)\n    main (/home/me/x.py:35)\n"
        'Thread 6 (idle): "watcher"\n    wait (/usr/lib/python3.11/threading.py:331)\n'
    )
    assert pyspy_frames(text) == [("/home/me/x.py", 23, "stall"), ("/home/me/x.py", 35, "main")]


def test_step_marks_count_and_time_steps():
    before = heartbeat.PROGRESS.step
    assert heartbeat.step() == before + 1 and heartbeat.PROGRESS.phase == "step"
    assert heartbeat.step(41) == 41
    heartbeat.mark("data")
    assert heartbeat.PROGRESS.phase == "data" and heartbeat.PROGRESS.step == 41


def test_a_watcher_ignores_another_runs_declaration_and_follows_its_own(tmp_path, monkeypatch):
    """A real watcher thread (one rank, a 2 s timeout, a beat every 0.5 s) in this process, not ending it: a
    `declared` file left by another launch in the same run directory is ignored; one of its own run makes it
    dump at its next beat, and as the only rank it writes the diagnosis naming itself. It prints the
    paragraph before it writes the attempt's diagnosis.txt: the other ranks exit once that file is there,
    and mpirun then stops the leader within about a second (measured with Open MPI 4.1)."""
    from exatrain.observe import hang
    from exatrain.observe.hang import DECLARED, HangWatcher

    said = []
    monkeypatch.setattr(
        hang, "_say", lambda text: said.append((text, (watcher.dir / "diagnosis.txt").exists()))
    )
    heartbeat.step()
    watcher = HangWatcher(tmp_path, 0, 1, 2.0, host="here", exit_process=False)
    watcher.start()
    try:
        (watcher.dir / DECLARED).write_text("another launch")
        time.sleep(1.5)
        assert not (watcher.dir / "report-rank-0.json").exists()
        (watcher.dir / DECLARED).write_text(watcher.token)
        deadline = time.monotonic() + 10
        while watcher.diagnosis is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        watcher.stop()
    assert watcher.diagnosis.startswith("exatrain: HANG (no progress for over 2 s): rank 0 (here, pid ")
    # the main thread's own line at the dump: this test, waiting below
    assert "test_hang_settings.py:" in watcher.diagnosis and "time.sleep(0.1)" in watcher.diagnosis
    assert "Thread " in (watcher.dir / "stacks-rank-0.txt").read_text()
    assert (tmp_path / "hang" / "diagnosis.txt").read_text().strip() == watcher.diagnosis
    assert said == [(watcher.diagnosis, False)]  # printed before the others' signal to leave
    assert (watcher.dir / "diagnosis.txt").read_text().strip() == watcher.diagnosis


def test_the_collective_timeouts_leader_prints_before_the_others_may_leave(tmp_path, monkeypatch):
    """The first rank to reach `on_collective_timeout` (here the only one) signals the others, diagnoses and
    prints the paragraph; only then does it write the attempt's diagnosis.txt, which the other ranks wait for
    before they exit (mpirun stops the remaining ranks about a second after the first exit)."""
    from exatrain.env.watch import HangRequest
    from exatrain.launch import stack_dump

    req = HangRequest(timeout_s="auto", run_dir=str(tmp_path), rank=0, world_size=1, attempt=0, host="here")
    d = stack_dump.attempt_dir(req)
    d.mkdir(parents=True)
    (d / "pid-rank-0.json").write_text('{"rank": 0, "pid": 1, "host": "here", "token": "t"}')
    said = []
    monkeypatch.setattr(
        stack_dump, "_print_err", lambda text: said.append((text, (d / "diagnosis.txt").exists()))
    )
    try:
        raise RuntimeError("Timed out waiting 8000ms for recv operation to complete")
    except RuntimeError as e:
        assert stack_dump.on_collective_timeout(e, req) == 76
    assert [flag for _, flag in said] == [False]
    assert said[0][0].startswith("exatrain: HANG (a collective timed out in rank 0): ")
    assert (d / "diagnosis.txt").read_text().strip() == said[0][0]


def _steps(monkeypatch, *gaps: float) -> None:
    """A fresh progress record whose step marks are `gaps` seconds apart (the first gap: the warm-up)."""
    progress = heartbeat.Progress()
    monkeypatch.setattr(heartbeat, "PROGRESS", progress)
    t = 100.0
    progress.step_times.append(t)
    for gap in gaps:
        t += gap
        progress.step_times.append(t)


def test_the_derived_timeout_is_ten_median_steps_the_floor_or_the_warm_up(monkeypatch):
    _steps(monkeypatch)
    assert heartbeat.derived_timeout_s() is None  # one mark: the warm-up is not known yet
    _steps(monkeypatch, 5.0, 40.0, 41.0, 90.0)  # median of the steps after the first: 41 s
    assert heartbeat.derived_timeout_s() == 410.0
    _steps(monkeypatch, 5.0, 1.0, 2.0, 1.0)  # 10 x 1 s is below the 5 minute floor
    assert heartbeat.derived_timeout_s() == 300.0
    _steps(monkeypatch, 900.0, 1.0, 1.0)  # a warm-up (compilation) of 15 minutes
    assert heartbeat.derived_timeout_s() == 900.0
    _steps(monkeypatch, 100.0)  # only the warm-up is known: the floor, or the warm-up when longer
    assert heartbeat.derived_timeout_s() == 300.0 and heartbeat.derived_timeout_s(floor_s=50) == 100.0


def test_the_hang_timeout_accepts_auto_and_refuses_other_words(capsys):
    from exatrain.cli.main import build_parser
    from exatrain.env.watch import hang_request, hang_variables

    assert build_parser().parse_args(["run", "--hang-timeout", "auto"]).hang_timeout == "auto"
    assert hang_request(hang_variables("auto", "/r")).timeout_s == "auto"
    with pytest.raises(SystemExit) as stop:
        main(["run", "--hang-timeout", "soon", SCRIPT, "sleep"])
    assert stop.value.code == 2 and "'soon' is neither seconds nor auto" in capsys.readouterr().err


def test_an_auto_watcher_derives_its_timeout_from_the_warm_up_and_then_declares(
    tmp_path, monkeypatch, capsys
):
    """A real watcher thread in auto mode (floor lowered to 2 s for the test): until two step marks it has no
    timeout; a first step of 2.5 s (the warm-up) then sets it to 2.5 s (more than the floor and 10 x the
    0.05 s steps), printed once the first 10 steps are timed; a stall after that is declared as a hang of
    over 2.5 s. In a job with 1 s left, the derived timeout is warned about."""
    from exatrain.observe.hang import HangWatcher

    monkeypatch.setattr(heartbeat, "PROGRESS", heartbeat.Progress())
    heartbeat.step()
    # a SLURM job with 1 s left (end_time): the derived 2.5 s is warned about once known
    end = time.time() + 1.0
    watcher = HangWatcher(
        tmp_path, 0, 1, "auto", host="here", exit_process=False, auto_floor_s=2.0, end_time=end
    )
    watcher.start()
    try:
        time.sleep(2.5)  # the first step: longer than the floor, and not a hang
        assert watcher.timeout_s is None and watcher.diagnosis is None
        for _ in range(10):
            heartbeat.step()
            time.sleep(0.05)
        deadline = time.monotonic() + 15
        while watcher.diagnosis is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        watcher.stop()
    assert 2.5 <= watcher.timeout_s < 2.7
    err = capsys.readouterr().err
    assert f"hang timeout {watcher.timeout_s:.0f} s (derived: the longest of 10 x the median step" in err
    assert "WARNING: hang timeout 2.5" in err and "left of this SLURM job" in err and "\nHINT: " in err
    assert watcher.diagnosis.startswith(f"exatrain: HANG (no progress for over {watcher.timeout_s:g} s)")


def test_the_trainer_refuses_a_timeout_beyond_the_jobs_time_left(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(time.time()) + 120))
    assert main(["train", "--nproc", "2", "--run.hang_timeout_s=600", f"--run.dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "run.hang_timeout_s = 600 s is not shorter than the time left of this SLURM job" in err
    assert "\nHINT: choose a hang timeout well below" in err
    assert main(["train", "--nproc", "2", "--run.hang_timeout_s=-5", f"--run.dir={tmp_path}"]) == 2
    assert "run.hang_timeout_s = -5: negative, but not -1" in capsys.readouterr().err


def test_a_stopped_watcher_is_replaced_by_the_next_one_of_the_process(tmp_path):
    """A run that ends (or fails) stops its watcher: a later run in the same process (an in-process
    `exatrain train`, a notebook) gets a new watcher for its own run directory, not the stopped one."""
    from exatrain.observe.hang import start_watcher, stop_watcher

    first = start_watcher(tmp_path / "a", 0, 1, 30.0, host="here")
    first.stop()
    second = start_watcher(tmp_path / "b", 0, 1, 30.0, host="here")
    try:
        assert second is not first and second.run_dir == tmp_path / "b"
        assert second._thread.is_alive() and not first._thread.is_alive()
    finally:
        stop_watcher()


def test_nccl_groups_get_the_flight_recorder_unless_the_user_chose():
    from exatrain.distributed.variables import flight_recorder_variables

    # one name, the one this torch reads without warning (torch 2.11 warns when the old one is set)
    assert flight_recorder_variables({}, "nccl", "2.11.0+cu130") == {"TORCH_FR_BUFFER_SIZE": "2000"}
    assert flight_recorder_variables({}, "nccl", "2.4.1+rocm6.1") == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}
    assert flight_recorder_variables({}, "nccl", "2.7.0a0+git1234") == {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"
    }
    assert flight_recorder_variables({}, "nccl") == {"TORCH_FR_BUFFER_SIZE": "2000"}  # this torch: 2.13
    assert flight_recorder_variables({}, "gloo") == {}  # gloo's recorder is on by default
    assert flight_recorder_variables({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, "nccl") == {}  # turned off
    assert flight_recorder_variables({"TORCH_FR_BUFFER_SIZE": "50000"}, "nccl") == {}
