"""Which ranks and steps [profiler] chooses, and clear errors for bad values."""

import pytest

from exatrain.errors import ConfigError
from exatrain.observe.profiler import StepProfiler, parse_ranks, parse_steps


def test_rank_choices():
    assert parse_ranks("", 8) == set()
    assert parse_ranks("0,last", 8) == {0, 7}
    assert parse_ranks("0, 3,5", 8) == {0, 3, 5}
    assert parse_ranks("every:3", 8) == {0, 3, 6}
    assert parse_ranks("all", 3) == {0, 1, 2}
    assert parse_ranks("last", 1) == {0}


@pytest.mark.parametrize(
    "spec, words",
    [
        ("0,9", "rank 9 does not exist in a job of 8"),
        ("zero", "'zero' is not a number"),
        ("every:0", "must be at least 1"),
    ],
)
def test_bad_ranks_are_named(spec, words):
    with pytest.raises(ConfigError, match=words) as e:
        parse_ranks(spec, 8)
    assert "profiler.ranks" in str(e.value) and "HINT:" in str(e.value)


def test_steps():
    assert parse_steps("3-4") == (3, 4) and parse_steps("7") == (7, 7)
    with pytest.raises(ConfigError, match="profiler.steps='4-3'"):
        parse_steps("4-3")
    with pytest.raises(ConfigError, match="profiler.steps='0-2'"):
        parse_steps("0-2")


def test_off_records_nothing(tmp_path):
    p = StepProfiler("", "1-2", rank=0, world_size=2, run_dir=tmp_path)
    for n in (1, 2):
        p.begin(n)
        assert p.end(n) is None
    assert p.close() is None and not (tmp_path / "profile").exists()
