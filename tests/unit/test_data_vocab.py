"""Vocabulary: stable ids, encoding rules, JSON round trip, bad files."""

import json

import numpy as np
import pytest

from exatrain.data.vocab import EOS_ID, UNK_ID, Vocab
from exatrain.errors import DataError


def test_build_orders_by_count_then_token_with_specials_first():
    v = Vocab.build(["b a c a", "c a b", "   ", "d"])
    # counts: a=3, b=2, c=2, d=1 -> ties broken by token
    assert v.tokens == ["<eos>", "<unk>", "a", "b", "c", "d"]
    assert v.id("<eos>") == EOS_ID == 0 and v.id("<unk>") == UNK_ID == 1
    assert v.id("never-seen") == UNK_ID


def test_literal_specials_in_text_keep_their_fixed_ids():
    v = Vocab.build(["<unk> <unk> <unk> x"])
    assert v.tokens == ["<eos>", "<unk>", "x"]


def test_encode_appends_eos_skips_blank_lines_and_maps_unknown():
    v = Vocab.build(["the cat sat"])
    ids = v.encode_lines(["the cat\n", "\n", "   \t\n", " dog sat \n"])
    assert ids.dtype == np.int32
    assert v.decode(ids) == ["the", "cat", "<eos>", "<unk>", "sat", "<eos>"]
    assert v.encode_lines([]).shape == (0,)


def test_max_size_keeps_most_frequent():
    v = Vocab.build(["a a a b b c"], max_size=4)
    assert v.tokens == ["<eos>", "<unk>", "a", "b"]
    assert v.decode(v.encode_lines(["c a"])) == ["<unk>", "a", "<eos>"]
    with pytest.raises(DataError, match="too small") as e:
        Vocab.build(["a"], max_size=1)
    assert "HINT:" in str(e.value)


def test_json_round_trip_and_bad_files(tmp_path):
    v = Vocab.build(["héllo wörld", "wörld"])
    p = tmp_path / "vocab.json"
    v.to_json(p)
    assert Vocab.from_json(p) == v
    assert [f.name for f in tmp_path.iterdir()] == ["vocab.json"]  # no temp files left

    with pytest.raises(DataError, match="does not exist"):
        Vocab.from_json(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DataError, match="bad.json") as e:
        Vocab.from_json(tmp_path / "bad.json")
    assert "HINT:" in str(e.value)
    (tmp_path / "other.json").write_text(json.dumps({"tokens": ["a"]}))
    with pytest.raises(DataError, match="not an exatrain vocabulary"):
        Vocab.from_json(tmp_path / "other.json")


def test_constructor_rejects_missing_specials_and_duplicates():
    with pytest.raises(DataError):
        Vocab(["a", "b"])
    with pytest.raises(DataError, match="duplicate"):
        Vocab(["<eos>", "<unk>", "a", "a"])
