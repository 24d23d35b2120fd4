"""The world sizes / node counts of `exatrain scale`, and a clear error for bad ones."""

import pytest

from exatrain.errors import ExatrainError
from exatrain.tools.scale import parse_counts


def test_counts_are_sorted():
    assert parse_counts("4,1,2") == [1, 2, 4]


@pytest.mark.parametrize("text", ["", "1,1", "0,2", "two"])
def test_bad_counts_name_the_flag(text):
    with pytest.raises(ExatrainError, match="--nodes") as e:
        parse_counts(text, "--nodes")
    assert "HINT: e.g. exatrain scale --nodes 1,2,4" in str(e.value)


def test_report_of_a_folder_without_runs_says_so(tmp_path):
    from exatrain.tools.report import write_report

    with pytest.raises(ExatrainError, match="no summary.json") as e:
        write_report([str(tmp_path)], tmp_path / "report.html")
    assert "HINT: pass run directories" in str(e.value)
