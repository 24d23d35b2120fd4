"""tests/run_scan.py: what the whole run's scan of `exatrain run` output rejects, and what it lets pass."""

from tests.run_scan import findings


def test_a_future_warning_on_stderr_is_found():
    err = "/x/torch/distributed/__init__.py:12: FutureWarning: torch.distributed.reduce_op is deprecated\n"
    assert [f.split(":")[0] for f in findings("", err)] == ["stderr"]


def test_a_label_inside_a_line_is_found():
    # rank 1's line broke into rank 0's: what `python -u` workers printing word by word give
    out = "[rank 0] sum 0 [rank 1] sum 1 3.0\n3.0\n"
    assert len(findings(out, "")) == 1 and "mixed output" in findings(out, "")[0]


def test_whole_labelled_lines_and_exatrain_notes_pass():
    out = "[rank 0] sum 0 3.0\n[rank 1] sum 1 3.0\nplain line\n"
    err = "exatrain: [rank 1] note: binding cores 0-1\nexatrain: note: 2 ranks on 2 cores\n"
    assert findings(out, err) == []


def test_a_third_party_warning_listed_with_its_source_passes():
    """DeepSpeed's own call of a deprecated torch API warns under plain torchrun too: not exatrain's."""
    err = (
        "/x/torch/distributed/c10d_logger.py:83: FutureWarning: "
        "`torch.distributed.all_gather_into_tensor` is deprecated. Please use "
        "`torch.distributed.all_gather_single` instead.\n"
    )
    assert findings("", err) == []
    assert len(findings("", err.replace("all_gather_into_tensor", "reduce_op"))) == 1
