"""Hang detection: a watcher thread in every rank (docs/hangs.md).

Every `interval` the watcher rewrites its rank's heartbeat file RUN_DIR/hang/attempt-K/beat-rank-N.json
(step, phase, seconds since the last progress mark of `observe.heartbeat`, wall time). When its own rank
made no progress for `timeout_s`, or another rank declared a hang, it dumps this rank's Python stacks (all
threads, `faulthandler` from this thread: it works while the main thread waits inside gloo/NCCL, where a
signal handler would only run after the collective returns), the flight recorder's view of the rank's
collectives (torch's, where the backend keeps one) and a report. The lowest rank that reported waits for
the others (a rank whose heartbeat file went stale is stopped: its stack comes from `py-spy dump
--nonblocking` when it runs on the same host), writes RUN_DIR/hang/diagnosis.txt and prints it; then every
reporting rank ends its process with EXIT_HANG, so the launcher stops (or restarts) the job at once.
Files are the channel because hung ranks cannot use collectives.
"""

from __future__ import annotations

import faulthandler
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from exatrain.config.validate import check_hang_timeout
from exatrain.env.watch import node_name, run_token
from exatrain.errors import EXIT_HANG
from exatrain.files import read_json, write_json, write_text
from exatrain.launch import hang_exit
from exatrain.launch.stacks import pyspy_path
from exatrain.observe import heartbeat
from exatrain.observe.hang_report import diagnose, pyspy_frames, stall_frame, suspect_nodes, where
from exatrain.slurm.requeue import HANG_EXCLUDE

_active: HangWatcher | None = None
#: the timeout value that asks for a derived one (heartbeat.derived_timeout_s)
AUTO = "auto"
#: the file a rank creates once it declared a hang: the other ranks' watchers dump too at their next beat
DECLARED = "declared"


class HangWatcher:
    """The watcher thread of one rank (see the module docstring)."""

    def __init__(
        self,
        run_dir,
        rank: int,
        world_size: int,
        timeout_s: float | str,
        *,
        host: str,
        attempt: int = 0,
        end_time: float | None = None,
        exit_process: bool = True,
        auto_floor_s: float = heartbeat.AUTO_FLOOR_S,
    ):
        # "auto": derived from the first steps' times (heartbeat.derived_timeout_s), None until two marks
        self.auto = self.derived = timeout_s == AUTO
        self.auto_floor_s = check_hang_timeout(auto_floor_s, "hang timeout floor")
        self.timeout_s = None if self.auto else check_hang_timeout(timeout_s, "hang timeout")
        self.rank, self.world_size, self.host, self.pid = rank, world_size, host, os.getpid()
        self.node = node_name()  # the scheduler's name of this node (what a requeue excludes)
        self.run_dir = Path(run_dir)
        self.dir = self.run_dir / "hang" / f"attempt-{attempt}"
        self.interval = min(5.0, max(0.5, (self.timeout_s or self.auto_floor_s) / 8))
        self.stale_s = max(3 * self.interval, 3.0)  # a heartbeat file this old: its process is not running
        self.end_time, self.exit_process = end_time, exit_process
        self.token = run_token()  # files of another launch in the same directory are ignored
        self._stop = threading.Event()
        self._warned = self._beat_failed = False
        self.diagnosis: str | None = None
        self._thread = threading.Thread(target=self._run, name="exatrain-hang-watcher", daemon=True)

    def _path(self, kind: str, rank: int | None = None, suffix: str = "json") -> Path:
        return self.dir / f"{kind}-rank-{self.rank if rank is None else rank}.{suffix}"

    def start(self) -> "HangWatcher":
        """Clear this rank's files of an earlier run, write the first heartbeat, start the thread."""
        self.dir.mkdir(parents=True, exist_ok=True)
        # (not stacks-rank-N.txt: the script runner may hold it open for `exatrain dump`; a dump rewrites it)
        for kind, suffix in (("beat", "json"), ("report", "json"), ("fr", "json")):
            self._path(kind, suffix=suffix).unlink(missing_ok=True)
        if self.rank == 0:
            (self.dir / "diagnosis.txt").unlink(missing_ok=True)
            (self.dir / DECLARED).unlink(missing_ok=True)
            if self.timeout_s is not None:
                self._check_time_limit()
        self._beat()
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the thread (a finished or closing run) and write a last heartbeat: where the rank ended. A
        later `start_watcher` in this process starts a new one."""
        global _active
        if _active is self:
            _active = None
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=2 * self.interval)
            self._beat()

    def _check_time_limit(self) -> None:
        if self.end_time is not None and time.time() + self.timeout_s > self.end_time:
            _say(
                f"WARNING: hang timeout {self.timeout_s:g} s is longer than the "
                f"{self.end_time - time.time():.0f} s "
                "left of this SLURM job: a hang would burn the rest of the allocation undetected\n"
                "HINT: choose a hang timeout well below the job's time limit (e.g. 300 s)"
            )

    def _derive(self) -> None:
        """Auto mode: the timeout from the steps measured so far (heartbeat.derived_timeout_s), until the
        record of the first steps is complete; then rank 0 says what it is, once."""
        self.timeout_s = heartbeat.derived_timeout_s(self.auto_floor_s)
        if heartbeat.steps_timed():
            self.auto = False
            if self.rank == 0:
                _say(
                    f"hang timeout {self.timeout_s:.0f} s (derived: the longest of "
                    f"{heartbeat.AUTO_STEPS} x the "
                    f"median step, {self.auto_floor_s:g} s and the first step; set one with "
                    "--hang-timeout or "
                    "run.hang_timeout_s)"
                )
                self._check_time_limit()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self.auto:
                self._derive()
            try:
                self._beat()
            except OSError as e:  # a full or vanished run directory: say so once, keep watching
                if not self._beat_failed:
                    _say(
                        f"WARNING: the hang watcher cannot write its heartbeat ({e}); other ranks will take "
                        f"rank {self.rank} for stopped\nHINT: check that {self.dir} is writable"
                    )
                self._beat_failed = True
            self._check_step_time()
            if self._stalled() or self._peer_reported():
                self._handle()
                return

    def _beat(self) -> None:
        p = heartbeat.PROGRESS
        beat = {"idle_s": time.monotonic() - p.since, "written": time.time()}
        write_json(self._path("beat"), {**self._identity_and_progress(p), **beat})

    def _identity_and_progress(self, p) -> dict:
        """This rank's identity and progress, the fields its heartbeat and its hang report share."""
        return {
            "rank": self.rank,
            "host": self.host,
            "node": self.node,
            "device": p.device,
            "pid": self.pid,
            "token": self.token,
            "step": p.step,
            "batches": p.batches,
            "phase": p.phase,
        }

    def _check_step_time(self) -> None:
        step_s = heartbeat.measured_step_s()
        if self._warned or step_s is None or self.rank != 0 or self.derived:
            return
        self._warned = True
        if self.timeout_s < 3 * step_s:
            _say(
                f"WARNING: hang timeout {self.timeout_s:g} s is less than 3 measured steps "
                f"({step_s:.2f} s each): "
                "a slow step (an evaluation, a checkpoint) would be taken for a hang\n"
                f"HINT: raise the hang timeout to at least {max(10 * step_s, 60):.0f} s"
            )

    def _stalled(self) -> bool:
        p = heartbeat.PROGRESS
        return self.timeout_s is not None and p.marks > 0 and time.monotonic() - p.since > self.timeout_s

    def _peer_reported(self) -> bool:
        # one small read per beat, not a directory listing: cheap on a parallel file system with many ranks
        try:
            return (self.dir / DECLARED).read_text() == self.token
        except OSError:
            return False

    def _handle(self) -> None:
        """Dump, report, let the leader diagnose, then end the process (see the module docstring); a dump
        that fails (an unwritable run directory) still ends it: a hang must not outlive its detection."""
        if self.timeout_s is None:  # auto mode, a peer declared a hang before this rank measured its steps
            self.timeout_s = heartbeat.derived_timeout_s(self.auto_floor_s) or self.auto_floor_s
        try:
            self._report()
            reports, stopped = self._gather()
            if self.rank == min(reports, default=self.rank):
                self._lead(reports, stopped)
            else:
                self._await_diagnosis()
        except Exception as e:
            _say(
                f"rank {self.rank} is hung (no progress for over {self.timeout_s:g} s) but its "
                f"dump failed: {e!r}"
            )
        if self.exit_process:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_HANG)

    def _report(self) -> None:
        p = heartbeat.PROGRESS
        with self._path("stacks", suffix="txt").open("w") as f:
            faulthandler.dump_traceback(f, all_threads=True)
        frame = sys._current_frames().get(threading.main_thread().ident)
        stack = reversed(traceback.extract_stack(frame)) if frame else []
        frames = [(fs.filename, fs.lineno, fs.name) for fs in stack]
        write_json(
            self._path("report"),
            {
                **self._identity_and_progress(p),
                "stalled_s": time.monotonic() - p.since,
                "where": where(stall_frame(frames)),
                "collective": _collective_state(self._path("fr")),
            },
        )
        (self.dir / DECLARED).write_text(self.token)

    def _gather(self) -> tuple[dict[int, dict], dict[int, dict]]:
        """Every rank's report, or its last heartbeat once that went stale; waits at most stale_s + 2
        beats."""
        deadline = time.monotonic() + self.stale_s + 2 * self.interval
        while True:
            reports, stopped = {}, {}
            for r in range(self.world_size):
                rep, beat = (self._own_run(read_json(self._path(kind, r))) for kind in ("report", "beat"))
                if rep:
                    reports[r] = rep
                elif beat and time.time() - beat["written"] > self.stale_s:
                    stopped[r] = {**beat, "silent_s": time.time() - beat["written"]}
            if len(reports) + len(stopped) == self.world_size or time.monotonic() > deadline:
                return reports, stopped
            time.sleep(min(self.interval, 1.0))

    def _own_run(self, data: dict | None) -> dict | None:
        return data if data is not None and data.get("token") == self.token else None

    def _lead(self, reports: dict[int, dict], stopped: dict[int, dict]) -> None:
        for r, beat in stopped.items():
            if beat.get("host") == self.host:
                beat["where"] = _pyspy_where(beat["pid"], self._path("stacks", r, "txt"))
        suspects = suspect_nodes(reports, stopped)
        self.diagnosis = diagnose(reports, stopped, self.world_size, self.timeout_s) + (
            f" Every rank's stacks: {self.dir}/stacks-rank-N.txt; this text: "
            f"{self.run_dir / 'hang' / 'diagnosis.txt'}. The ranks exit with code {EXIT_HANG}: the launcher "
            "stops the job (or restarts it, with restarts allowed)."
        )
        if suspects:
            self.diagnosis += (
                f" Suspect node(s): {','.join(suspects)} (a SLURM job with job.hang_requeues is requeued "
                "without them)."
            )
        (self.run_dir / "hang" / "diagnosis.txt").write_text(self.diagnosis + "\n")
        # its existence tells the batch script that this launch ended on a hang (after the diagnosis)
        (self.run_dir / HANG_EXCLUDE).write_text(",".join(suspects) + "\n")
        _say(self.diagnosis)
        # last: the other ranks exit once it is there, and the first exit makes the launcher (mpirun at
        # once, torchrun's agent at its next poll) stop this rank too: only after the paragraph is out
        write_text(self.dir / "diagnosis.txt", self.diagnosis + "\n")

    def _await_diagnosis(self) -> None:
        deadline = time.monotonic() + 2 * self.stale_s + 5
        while not (self.dir / "diagnosis.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.2)


def _recorder_dump(torch) -> bytes:
    """The flight recorder's JSON dump for the default process group's backend. torch keeps NCCL's
    recorder (CUDA events) apart from the one of the other backends (gloo): a group with NCCL reads
    `_dump_nccl_trace_json` where this torch build has it, else (gloo, a build without NCCL) the
    generic `_dump_fr_trace_json`."""
    from torch._C import _distributed_c10d as c10d  # private: pinned by tests/distributed, tests/gpu

    backend = str(torch.distributed.get_backend()) if torch.distributed.is_initialized() else ""
    if "nccl" in backend and hasattr(c10d, "_dump_nccl_trace_json"):
        return c10d._dump_nccl_trace_json(True, False)
    return c10d._dump_fr_trace_json(True, False)


def _collective_state(dump_path: Path) -> dict | None:
    """The newest collective of the default process group from torch's flight recorder (written in full
    to `dump_path`): {"op", "enqueued", "completed"}; None without torch.distributed or a recorder."""
    torch = sys.modules.get("torch")
    if torch is None or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return None
    try:
        raw = _recorder_dump(torch)
        dump_path.write_bytes(raw)
        data = json.loads(raw)
        status = data["pg_status"][min(data["pg_status"], key=int)]  # the default group: id 0
        enqueued = int(status["last_enqueued_collective"])
        ops = [
            e
            for e in data.get("entries", [])
            if e.get("collective_seq_id") == enqueued and not e.get("is_p2p")
        ]
        return {
            "op": ops[-1]["profiling_name"] if ops else "a collective",
            "enqueued": enqueued,
            "completed": int(status["last_completed_collective"]),
        }
    except Exception:  # an older torch, or a backend without a recorder: the report says less, nothing fails
        return None


def flight_recorder_works() -> bool:
    """Whether torch's flight recorder answers for this rank's process groups (after init_process_group)."""
    torch = sys.modules.get("torch")
    try:
        return "pg_status" in json.loads(_recorder_dump(torch))
    except Exception:
        return False


def _pyspy_where(pid: int, out: Path) -> str | None:
    """The stall line of a stopped process on this host from `py-spy dump --nonblocking` (its whole output
    to `out`), None without py-spy or when it cannot read the process."""
    exe = pyspy_path()
    if exe is None:
        return None
    try:
        run = subprocess.run(
            [exe, "dump", "--nonblocking", "--full-filenames", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    out.write_text(run.stdout + run.stderr)
    frames = pyspy_frames(run.stdout)
    return where(stall_frame(frames)) if frames else None


def _say(text: str) -> None:
    print(f"exatrain: {text}" if not text.startswith("exatrain:") else text, file=sys.stderr, flush=True)


def start_watcher(
    run_dir,
    rank: int,
    world_size: int,
    timeout_s: float | str,
    *,
    host: str,
    attempt: int = 0,
    end_time: float | None = None,
) -> HangWatcher:
    """Start this process's watcher (or return the one running: one per process, like its heartbeat)."""
    global _active
    if _active is None:
        _active = HangWatcher(
            run_dir, rank, world_size, timeout_s, host=host, attempt=attempt, end_time=end_time
        ).start()
        hang_exit.watched()  # the watcher, not hang_exit's thread, ends this process after a hang
    return _active


def stop_watcher() -> None:
    """Stop this process's watcher, if one runs (a run that ends cleanly is no hang)."""
    global _active
    if _active is not None:
        _active.stop()
        _active = None
        hang_exit.watched(False)


def watch_hangs(ctx, run_dir, timeout_s: float | str = AUTO) -> HangWatcher:
    """Watch this rank for hangs (`exatrain.watch_hangs`): after `timeout_s` without progress (DataLoader
    batches, Checkpointer calls, `exatrain.step()`), every rank's stacks and a diagnosis go to
    RUN_DIR/hang/ and the job stops with EXIT_HANG. `ctx`: the Context of exatrain.init(). `timeout_s`
    "auto" (the default): derived from the first steps (heartbeat.derived_timeout_s)."""
    from exatrain.env.watch import job_end_time

    env = ctx.env
    return start_watcher(
        run_dir,
        ctx.rank,
        ctx.world_size,
        timeout_s,
        host=env.hostname,
        attempt=env.restart_count,
        end_time=job_end_time(),
    )


def arm_from_environment() -> None:
    """Start the watcher `exatrain run --hang-timeout` asked for (at the first progress mark)."""
    from exatrain.env.watch import hang_request, job_end_time

    req = hang_request()
    if req is not None and req.watch and _active is None:
        start_watcher(
            req.run_dir,
            req.rank,
            req.world_size,
            req.timeout_s,
            host=req.host,
            attempt=req.attempt,
            end_time=job_end_time(),
        )
