"""Corpus readers: WikiText directories, raw text directories, the synthetic language."""

from pathlib import Path

import numpy as np
import pytest

from exatrain.data import load_corpus, load_text_dir, load_wikitext, synthetic_corpus
from exatrain.data.corpus import read_lines
from exatrain.data.rawtext import split_lines, split_of, text_files
from exatrain.data.synthetic import SyntheticLanguage
from exatrain.errors import DataError

SHARED_WIKITEXT = Path(__file__).resolve().parents[3] / "shared/data/wikitext-2"

TRAIN = " = Title = \n \n the cat sat on the mat \n the dog sat \n"
VALID = " the cat ran \n"
TEST = " a bird sat \n \n"


def write_splits(d: Path, scheme: str, splits=("train", "valid", "test")) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    texts = {"train": TRAIN, "valid": VALID, "test": TEST}
    for s in splits:
        name = f"wiki.{s}.tokens" if scheme == "wiki" else f"{s}.txt"
        (d / name).write_text(texts[s], encoding="utf-8")
    return d


# ---------------------------------------------------------------- wikitext
@pytest.mark.parametrize("scheme", ["wiki", "txt"])
def test_wikitext_both_naming_schemes(tmp_path, scheme):
    c = load_wikitext(write_splits(tmp_path / scheme, scheme))
    v = c.vocab
    assert c.name == "wikitext" and set(c.splits) == {"train", "valid", "test"}
    assert all(a.dtype == np.int32 for a in c.splits.values())
    assert (
        v.decode(c.splits["train"])
        == "= Title = <eos> the cat sat on the mat <eos> the dog sat <eos>".split()
    )
    # vocabulary from train only: "ran", "a", "bird" are unknown
    assert "ran" not in v and "bird" not in v
    assert v.decode(c.splits["valid"]) == ["the", "cat", "<unk>", "<eos>"]
    assert v.decode(c.splits["test"]) == ["<unk>", "<unk>", "sat", "<eos>"]
    assert v.tokens[:3] == ["<eos>", "<unk>", "the"]  # "the" is the most frequent word


def test_wikitext_valid_only_dir_errors_and_train_from_valid(tmp_path):
    d = write_splits(tmp_path, "txt", splits=("valid", "test"))
    with pytest.raises(DataError) as e:
        load_wikitext(d)
    msg = str(e.value)
    assert str(d) in msg and "train" in msg and "HINT:" in msg and 'train_from="valid"' in msg

    c = load_wikitext(d, train_from="valid")
    assert c.vocab.decode(c.splits["train"]) == ["the", "cat", "ran", "<eos>"]
    # validating on test when training on valid
    assert c.vocab.decode(c.splits["valid"]) == ["<unk>", "<unk>", "<unk>", "<eos>"]
    with pytest.raises(DataError, match="not a WikiText split"):
        load_wikitext(d, train_from="training")


def test_wikitext_missing_and_empty_dirs(tmp_path):
    with pytest.raises(DataError, match="does not exist") as e:
        load_wikitext(tmp_path / "nope")
    assert "exatrain data prepare wikitext-2" in str(e.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="lacks") as e:
        load_wikitext(tmp_path / "empty")
    assert "HINT:" in str(e.value)
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(DataError, match="not a directory"):
        load_wikitext(tmp_path / "f.txt")
    blank = write_splits(tmp_path / "blank", "txt")
    (blank / "train.txt").write_text("\n  \n")
    with pytest.raises(DataError, match="train split .* has no tokens"):
        load_wikitext(blank)


def test_non_utf8_file_names_the_file(tmp_path):
    d = write_splits(tmp_path, "txt")
    (d / "train.txt").write_bytes(b"caf\xe9 au lait\n")
    with pytest.raises(DataError, match="train.txt is not valid UTF-8") as e:
        load_wikitext(d)
    assert "iconv" in str(e.value)


@pytest.mark.skipif(
    not (SHARED_WIKITEXT / "valid.txt").is_file(), reason="no shared WikiText-2 valid/test copy"
)
def test_shared_wikitext2_valid_test(tmp_path):
    with pytest.raises(DataError, match="lacks the train split"):
        load_corpus("wikitext", SHARED_WIKITEXT, tmp_path)
    c = load_corpus("wikitext", SHARED_WIKITEXT, tmp_path, train_from="valid")
    assert 10_000 < len(c.vocab) < 20_000
    assert 200_000 < len(c.splits["train"]) < 230_000
    assert 230_000 < len(c.splits["valid"]) < 260_000
    unk = np.mean(np.asarray(c.splits["valid"]) == 1)
    assert 0.02 < unk < 0.2  # test words unseen in valid are <unk>


# ---------------------------------------------------------------- raw text
def test_split_rule():
    assert [n for n in range(1, 62) if split_of(n) == "valid"] == [20, 40, 60]
    assert [n for n in range(1, 62) if split_of(n) == "test"] == [21, 41, 61]


def test_raw_text_dir_recursive_sorted_and_split(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "a.txt").write_text("".join(f"line{i} common\n\n" for i in range(1, 31)))  # lines 1-30
    (tmp_path / "b" / "c.md").write_text("".join(f"line{i} common\n" for i in range(31, 46)))  # 31-45
    (tmp_path / "b" / "zz").write_text("line46 common\n")  # no suffix: used; sorts after b/c.md
    (tmp_path / "skip.bin").write_text("binary junk\n" * 50)
    (tmp_path / ".hidden.txt").write_text("secret\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "x.txt").write_text("secret\n")

    files = text_files(tmp_path)
    assert [f.relative_to(tmp_path).as_posix() for f in files] == ["a.txt", "b/c.md", "b/zz"]
    parts = split_lines([read_lines(f) for f in files])
    assert [line.split()[0] for line in parts["valid"]] == ["line20", "line40"]
    assert [line.split()[0] for line in parts["test"]] == ["line21", "line41"]

    c = load_text_dir(tmp_path)
    dec = {k: c.vocab.decode(v) for k, v in c.splits.items()}
    # lines 20, 40 -> valid and 21, 41 -> test; their lineN words never occur in train -> <unk>
    assert dec["valid"] == dec["test"] == ["<unk>", "common", "<eos>", "<unk>", "common", "<eos>"]
    words = [w for w in dec["train"] if w.startswith("line")]
    assert words == [f"line{i}" for i in range(1, 47) if i not in (20, 21, 40, 41)]
    assert "junk" not in c.vocab and "secret" not in c.vocab

    capped = load_text_dir(tmp_path, max_vocab=3)
    assert capped.vocab.tokens == ["<eos>", "<unk>", "common"]


def test_raw_text_errors(tmp_path):
    (tmp_path / "only.bin").write_text("x\n")
    with pytest.raises(DataError, match="no usable text files") as e:
        load_text_dir(tmp_path)
    assert "HINT:" in str(e.value)
    (tmp_path / "short.txt").write_text("just a few lines\n" * 5)
    with pytest.raises(DataError, match="valid split .* has no tokens") as e:
        load_text_dir(tmp_path)
    assert "at least 20" in str(e.value)
    (tmp_path / "short.txt").write_text("\n\n")
    with pytest.raises(DataError, match="train split"):
        load_text_dir(tmp_path)


# ---------------------------------------------------------------- synthetic
def test_synthetic_deterministic():
    a = synthetic_corpus(seed=7, n_train_tokens=1_000_000)
    b = synthetic_corpus(seed=7, n_train_tokens=1_000_000)
    c = synthetic_corpus(seed=8, n_train_tokens=1_000_000)
    for s in ("train", "valid", "test"):
        assert a.splits[s].dtype == np.int32
        assert a.splits[s].tobytes() == b.splits[s].tobytes()
        assert not np.array_equal(a.splits[s], c.splits[s])
    assert [len(a.splits[s]) for s in ("train", "valid", "test")] == [1_000_000, 50_000, 50_000]
    assert len(a.vocab) == 512 and a.vocab.tokens[2] == "w0"
    assert a.splits["train"].min() >= 0 and a.splits["train"].max() < 512
    # one split's length does not change the others
    d = synthetic_corpus(seed=7, n_train_tokens=10_000)
    assert np.array_equal(d.splits["valid"], a.splits["valid"])
    assert np.array_equal(d.splits["train"], a.splits["train"][:10_000])


def _conditional_entropy(ctx: np.ndarray, nxt: np.ndarray, base: int) -> float:
    key = ctx.astype(np.int64) * base + nxt
    keys, counts = np.unique(key, return_counts=True)
    ctx_keys, ctx_counts = np.unique(ctx, return_counts=True)
    totals = ctx_counts[np.searchsorted(ctx_keys, keys // base)]
    return float(-(counts * np.log(counts / totals)).sum() / counts.sum())


def test_synthetic_is_learnable():
    c = synthetic_corpus(n_train_tokens=300_000)
    tr = c.splits["train"]
    V = len(c.vocab)
    ideal = c.meta["ideal_perplexity"]
    assert 4 < ideal < 20
    _, counts = np.unique(tr, return_counts=True)
    p = counts / counts.sum()
    unigram_ppl = float(np.exp(-(p * np.log(p)).sum()))
    bigram_ppl = float(np.exp(_conditional_entropy(tr[:-1], tr[1:], V)))
    assert unigram_ppl > 150  # no shortcut through word frequencies
    assert bigram_ppl < 20 < V  # a bigram model already cuts perplexity far below log(V)
    assert bigram_ppl > ideal  # ...and longer context helps beyond that
    eos = np.flatnonzero(tr == 0)
    lengths = np.diff(eos) - 1
    assert lengths.min() >= 5 and lengths.max() <= 20


def test_synthetic_small_vocab_and_errors():
    c = synthetic_corpus(
        vocab_size=64, n_topics=4, n_train_tokens=5000, n_valid_tokens=500, n_test_tokens=500
    )
    assert len(c.vocab) == 64 and c.splits["train"].max() < 64
    assert SyntheticLanguage(vocab_size=64, n_topics=4).entropy_perplexity() > 1
    with pytest.raises(DataError, match="too small") as e:
        synthetic_corpus(vocab_size=10)
    assert "HINT:" in str(e.value)
