"""launch.lines: the writer under each rank's stdout/stderr hands the descriptor whole lines, in writes of
at most PIPE_BUF bytes that end at a line end, each line begun by the label; an explicit flush writes a
partial line (whose rest then gets no second label); the last lines are kept for a failure report."""

import collections
import io
import json
import os

from exatrain.launch.lines import PIPE_BUF, TAIL_LINES, LineWriter, record_failure


class Recorder(LineWriter):
    """Records each os.write the real writer makes (on a real pipe)."""

    def __init__(self, prefix=b""):
        self.read_end, fd = os.pipe()
        super().__init__(fd, prefix, collections.deque(maxlen=TAIL_LINES))
        self.writes = []

    def _emit(self, text):
        real = os.write

        def spy(fd, data):
            self.writes.append(bytes(data))
            return real(fd, data)

        os.write = spy
        try:
            super()._emit(text)
        finally:
            os.write = real


def _text(writer, line_buffering=True):
    return io.TextIOWrapper(writer, encoding="utf-8", line_buffering=line_buffering)


def test_a_print_of_many_arguments_is_one_write_of_one_labelled_line():
    raw = Recorder(b"[rank 3] ")
    out = _text(raw)
    print("rank", 3, "loss", 2.0, file=out)
    print("next", file=out)
    assert raw.writes == [b"[rank 3] rank 3 loss 2.0\n", b"[rank 3] next\n"]
    assert list(raw.tail) == ["rank 3 loss 2.0", "next"]


def test_a_flushed_partial_line_is_written_and_its_rest_gets_no_second_label():
    raw = Recorder(b"[rank 0] ")
    out = _text(raw)
    out.write("progress 10%")
    assert raw.writes == []  # held until the line ends or someone flushes
    out.flush()
    out.write(" 20%\n")
    assert raw.writes == [b"[rank 0] progress 10%", b" 20%\n"]


def test_long_output_goes_out_in_writes_of_at_most_pipe_buf_ending_at_line_ends():
    raw = Recorder(b"[rank 1] ")
    lines = [f"line {i} " + "x" * (i % 97) for i in range(400)]
    raw.write(("\n".join(lines) + "\n").encode())
    assert len(raw.writes) > 1 and all(len(w) <= PIPE_BUF and w.endswith(b"\n") for w in raw.writes)
    assert b"".join(raw.writes).decode().splitlines() == [f"[rank 1] {line}" for line in lines]
    assert list(raw.tail) == lines[-TAIL_LINES:]


def test_a_failure_is_recorded_in_torchruns_format_unless_the_script_recorded_one(tmp_path):
    path = tmp_path / "error.json"
    record_failure("ValueError: bad", collections.deque(["a", "b"]), str(path))
    message = json.loads(path.read_text())["message"]
    assert message["message"] == "ValueError: bad" and message["extraInfo"]["exatrain_last_lines"] == [
        "a",
        "b",
    ]
    assert int(message["extraInfo"]["timestamp"]) == message["extraInfo"]["exatrain_time_ns"] // 10**9
    record_failure("other", collections.deque(), str(path))  # torch's @record wrote it first: kept
    assert json.loads(path.read_text())["message"]["message"] == "ValueError: bad"
    record_failure("ignored", collections.deque(), None)  # outside torchrun: nothing to write to


def test_the_first_failure_is_chosen_by_the_runners_nanoseconds_not_by_whole_seconds_and_rank(tmp_path):
    """Two ranks failing in the same second: torch's choice (whole seconds, then the lowest rank) would name
    rank 0; the script runner's nanosecond time names rank 2. A worker with no record (killed) comes last."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from exatrain.launch.agent import first_failure

    def failure(rank, ns):
        path = tmp_path / f"{rank}.json"
        if ns is not None:
            path.write_text(
                json.dumps(
                    {
                        "message": {
                            "message": "x",
                            "extraInfo": {"timestamp": str(1_700_000_000), "exatrain_time_ns": ns},
                        }
                    }
                )
            )
        return ProcessFailure(
            local_rank=rank, pid=100 + rank, exitcode=1 if ns else -15, error_file=str(path)
        )

    failures = {
        0: failure(0, 1_700_000_000_900_000_000),
        1: failure(1, None),
        2: failure(2, 1_700_000_000_100_000_000),
    }
    assert first_failure(failures)[0] == 2


def test_a_rank_that_reported_its_error_comes_before_one_the_agent_terminated(tmp_path):
    """A script with torch's @record (no script-runner record): rank 1 raised and wrote torchrun's error file,
    rank 0 was ended by the agent's SIGTERM in the same second. Rank 1 failed first (CI once named rank 0,
    the lower rank of the tie)."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from exatrain.launch.agent import first_failure

    reported = tmp_path / "1.json"
    # what torch's @record writes (its ErrorHandler.record_exception): message, then extraInfo with the time
    extra = {"py_callstack": "Traceback ...", "timestamp": "1700000000"}
    reported.write_text(json.dumps({"message": {"message": "ValueError: bad batch", "extraInfo": extra}}))
    failures = {
        0: ProcessFailure(local_rank=0, pid=100, exitcode=-15, error_file=str(tmp_path / "none.json")),
        1: ProcessFailure(local_rank=1, pid=101, exitcode=1, error_file=str(reported)),
    }
    failures[0].timestamp = failures[1].timestamp  # the same whole second
    assert first_failure(failures)[0] == 1
