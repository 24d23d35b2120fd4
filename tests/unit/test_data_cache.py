"""Tokenised cache (reuse, invalidation, concurrent writers) and the load_corpus entry point."""

import hashlib
import multiprocessing as mp
import os
import time
from pathlib import Path

import numpy as np
import pytest

import exatrain.data.loading as loading
from exatrain.data import cached_corpus, load_corpus, synthetic_corpus
from exatrain.data.cache import DONE, read_entry
from exatrain.errors import DataError

SMALL = {"n_train_tokens": 20_000, "n_valid_tokens": 2_000, "n_test_tokens": 2_000}


def write_wikitext(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "wiki.train.tokens").write_text(" = A = \n\n the cat sat on the mat \n" * 5)
    (d / "wiki.valid.tokens").write_text(" the cat sat \n")
    (d / "wiki.test.tokens").write_text(" the mat \n")
    return d


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir()) if cache.exists() else []


def test_second_load_reads_the_cache_without_tokenising(tmp_path, monkeypatch):
    data, cache = write_wikitext(tmp_path / "wt"), tmp_path / "cache"
    first = load_corpus("wikitext", data, cache)
    (entry,) = entries(cache)
    assert (entry / DONE).is_file() and {"train.npy", "valid.npy", "test.npy", "vocab.json"} <= {
        p.name for p in entry.iterdir()
    }
    mtimes = {p.name: p.stat().st_mtime_ns for p in entry.iterdir()}

    def boom(*a, **k):
        raise AssertionError("tokenised again despite a cache hit")

    monkeypatch.setattr(loading, "load_wikitext", boom)
    second = load_corpus("wikitext", data, cache)
    assert {p.name: p.stat().st_mtime_ns for p in entry.iterdir()} == mtimes
    assert isinstance(second.splits["train"], np.memmap)
    assert second.vocab == first.vocab
    for s in first.splits:
        assert np.array_equal(first.splits[s], second.splits[s])


def test_changed_source_or_options_make_a_new_entry(tmp_path):
    data, cache = write_wikitext(tmp_path / "wt"), tmp_path / "cache"
    load_corpus("wikitext", data, cache)
    time.sleep(0.01)
    (data / "wiki.train.tokens").write_text(" the dog sat \n" * 3)
    c = load_corpus("wikitext", data, cache)
    assert "dog" in c.vocab and len(entries(cache)) == 2
    load_corpus("wikitext", data, cache, train_from="valid")
    assert len(entries(cache)) == 3


def test_synthetic_is_cached_and_identical(tmp_path):
    a = load_corpus("synthetic", None, tmp_path, seed=3, **SMALL)
    b = load_corpus("synthetic", None, tmp_path, seed=3, **SMALL)
    fresh = synthetic_corpus(seed=3, **SMALL)
    assert len(entries(tmp_path)) == 1
    assert a.meta["ideal_perplexity"] == pytest.approx(fresh.meta["ideal_perplexity"])
    for s in fresh.splits:
        assert np.array_equal(a.splits[s], fresh.splits[s]) and np.array_equal(b.splits[s], fresh.splits[s])
    # no cache at all
    assert np.array_equal(
        load_corpus("synthetic", None, None, seed=3, **SMALL).splits["train"], fresh.splits["train"]
    )


def test_incomplete_entry_is_ignored_and_replaced(tmp_path):
    load_corpus("synthetic", None, tmp_path, **SMALL)
    (entry,) = entries(tmp_path)
    (entry / DONE).unlink()
    (entry / "train.npy").write_bytes(b"garbage")
    assert read_entry(entry) is None
    c = load_corpus("synthetic", None, tmp_path, **SMALL)
    assert len(c.splits["train"]) == SMALL["n_train_tokens"]
    assert (entry / DONE).is_file() and entries(tmp_path) == [entry]


_HANG_S = 600  # only a hang guard: the barriers, not the clock, order the writers


def _racing_build(seed, log_dir, inside):
    Path(log_dir, str(os.getpid())).touch()
    inside.wait(timeout=_HANG_S)  # every writer is inside its build before any may publish
    return synthetic_corpus(seed=seed, **SMALL)


def _writer(cache_dir, log_dir, barrier, inside, queue):
    import functools

    barrier.wait(timeout=_HANG_S)
    c = cached_corpus(
        cache_dir, "synthetic", [], {"seed": 5}, functools.partial(_racing_build, 5, log_dir, inside)
    )
    h = hashlib.sha256()
    for s in ("train", "valid", "test"):
        h.update(np.ascontiguousarray(c.splits[s]).tobytes())
    h.update("\n".join(c.vocab.tokens).encode())
    queue.put((os.getpid(), h.hexdigest()))


def test_concurrent_writers_all_succeed_with_identical_data(tmp_path):
    ctx = mp.get_context("spawn")
    n = 4
    cache, builds = tmp_path / "cache", tmp_path / "builds"
    builds.mkdir()
    barrier, inside, queue = ctx.Barrier(n), ctx.Barrier(n), ctx.Queue()
    procs = [
        ctx.Process(target=_writer, args=(str(cache), str(builds), barrier, inside, queue)) for _ in range(n)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(_HANG_S)
    assert [p.exitcode for p in procs] == [0] * n
    digests = {queue.get(timeout=5)[1] for _ in range(n)}
    assert len(digests) == 1
    assert len(list(builds.iterdir())) == n  # every writer really built and raced to publish
    # exactly one published entry, no temporary directories left behind
    (entry,) = cache.iterdir()
    assert not entry.name.startswith(".") and (entry / DONE).is_file()
    expected = synthetic_corpus(seed=5, **SMALL)
    h = hashlib.sha256()
    for s in ("train", "valid", "test"):
        h.update(expected.splits[s].tobytes())
    h.update("\n".join(expected.vocab.tokens).encode())
    assert digests == {h.hexdigest()}


# ---------------------------------------------------------------- load_corpus errors
def test_unknown_kind_lists_valid_kinds(tmp_path):
    with pytest.raises(DataError, match="unknown data kind 'imagenet'") as e:
        load_corpus("imagenet", None, tmp_path)
    assert "synthetic, wikitext, text" in str(e.value)


def test_unknown_option_lists_valid_options(tmp_path):
    with pytest.raises(DataError, match="n_train") as e:
        load_corpus("synthetic", None, tmp_path, n_train=5)
    assert "n_train_tokens" in str(e.value)


@pytest.mark.parametrize("kind", ["wikitext", "text"])
def test_missing_path_and_directory(tmp_path, kind):
    for path in (None, ""):
        with pytest.raises(DataError, match="no data.path") as e:
            load_corpus(kind, path, tmp_path / "cache")
        assert "HINT:" in str(e.value)
    with pytest.raises(DataError, match="does not exist") as e:
        load_corpus(kind, tmp_path / "missing", tmp_path / "cache")
    assert str(tmp_path / "missing") in str(e.value)
    if kind == "wikitext":
        assert "exatrain data prepare wikitext-2 --out DIR" in str(e.value)


def test_empty_dirs_and_empty_corpora(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no usable text files"):
        load_corpus("text", tmp_path / "empty", tmp_path / "cache")
    with pytest.raises(DataError, match="lacks the train, valid, test split"):
        load_corpus("wikitext", tmp_path / "empty", tmp_path / "cache")
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "a.txt").write_text("\n \n\n")
    with pytest.raises(DataError, match="train split .* has no tokens") as e:
        load_corpus("text", tmp_path / "blank", tmp_path / "cache")
    assert "HINT:" in str(e.value)
    assert not (tmp_path / "cache").exists() or entries(tmp_path / "cache") == []


def test_text_kind_max_vocab_zero_means_no_cap(tmp_path):
    d = tmp_path / "txt"
    d.mkdir()
    (d / "a.txt").write_text("".join(f"word{i % 7} other{i % 3}\n" for i in range(100)))
    full = load_corpus("text", d, tmp_path / "cache", max_vocab=0)
    capped = load_corpus("text", d, tmp_path / "cache", max_vocab=4)
    assert len(full.vocab) == 12 and len(capped.vocab) == 4


def test_unwritable_cache_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(DataError, match="cache") as e:
        load_corpus("synthetic", None, blocker / "cache", **SMALL)
    assert "data.cache_dir" in str(e.value)
