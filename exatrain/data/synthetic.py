"""A deterministic synthetic language: the project's default training data (no files, no downloads).

The process, all tables drawn from ``seed``:

* ``vocab_size - 2`` words ``w0, w1, ...`` (ids 2, 3, ...; ids 0/1 are ``<eos>``/``<unk>``);
  ``n_topics`` topics, each with its own set of start words (disjoint across topics) and a pool of
  about a quarter of the words.
* A sentence picks a topic and a length L (uniform in 5..20), starts with one of the topic's start
  words, then draws each next word from 4 successors of (topic, previous word) with probabilities
  0.4/0.3/0.2/0.1, the order of those probabilities rotated by a class of the word *two* back
  (second-order dependence). After L words comes ``<eos>``.

So a model must learn bigram-like successor sets (fast), then use the sentence's first word (topic)
and the word two back to sharpen its guess. Uniform guessing has perplexity ~= vocab_size; the true
process has perplexity ~5 (see :meth:`SyntheticLanguage.entropy_perplexity`), so a tiny Transformer
trained a minute or two on a CPU drops from ~500 to well below 100.

Each split has its own random stream (``[seed, split]``), so changing one split's length never changes
another split (and a shorter split is a prefix of a longer one); the same arguments always give
byte-identical arrays.
"""

from __future__ import annotations

import math

import numpy as np

from exatrain.data.corpus import Corpus
from exatrain.data.vocab import EOS, EOS_ID, UNK, Vocab
from exatrain.errors import DataError

SUCCESSOR_PROBS = np.array([0.4, 0.3, 0.2, 0.1])
MIN_LEN = 5
MAX_LEN = 20
_START_WORDS = 16
_CHUNK_SENTENCES = 4096
_SPLIT_STREAM = {"train": 1, "valid": 2, "test": 3}


class SyntheticLanguage:
    """The generating process of the synthetic corpus (tables fixed by ``seed``)."""

    def __init__(self, seed: int = 1234, vocab_size: int = 512, n_topics: int = 8):
        n_words = vocab_size - 2
        succ = len(SUCCESSOR_PROBS)
        if n_topics < 1 or n_words < max(4 * succ, 2 * n_topics):
            raise DataError(
                f"synthetic corpus with vocab_size={vocab_size} and n_topics={n_topics} is too small",
                f"use vocab_size >= {max(4 * succ, 2 * n_topics) + 2} and n_topics >= 1 "
                "(defaults: 512 and 8)",
            )
        self.seed = int(seed)
        self.vocab_size = int(vocab_size)
        self.n_topics = int(n_topics)
        self.n_words = n_words
        rng = np.random.default_rng([self.seed, 0])
        spt = max(1, min(_START_WORDS, n_words // (2 * n_topics)))
        self.start_per_topic = spt
        order = rng.permutation(n_words)
        self.starts = order[: n_topics * spt].reshape(n_topics, spt)  # disjoint start words per topic
        pool_size = max(2 * succ, n_words // 4)
        self.successors = np.empty((n_topics, n_words, succ), dtype=np.int64)
        for k in range(n_topics):
            others = np.setdiff1d(np.arange(n_words), self.starts[k])
            extra = rng.choice(others, size=pool_size - spt, replace=False)
            pool = np.concatenate([self.starts[k], extra])
            # For every previous word: `succ` distinct successors from the topic's pool.
            pick = np.argsort(rng.random((n_words, pool.size)), axis=1)[:, :succ]
            self.successors[k] = pool[pick]
        self.rotation = rng.integers(0, succ, size=n_words)  # class of the word two back

    # ------------------------------------------------------------------ generation
    def generate(self, n_tokens: int, rng: np.random.Generator) -> np.ndarray:
        """``n_tokens`` token ids (int32) of consecutive sentences, each ending with ``<eos>``."""
        if n_tokens < 0:
            raise DataError(f"synthetic split length {n_tokens} is negative", "use a token count >= 0")
        chunks, have = [], 0
        while have < n_tokens:  # fixed-size chunks: a shorter split is a prefix of a longer one
            part = self._sentences(_CHUNK_SENTENCES, rng)
            chunks.append(part)
            have += part.size
        out = np.concatenate(chunks) if chunks else np.empty(0, dtype=np.int32)
        return np.ascontiguousarray(out[:n_tokens], dtype=np.int32)

    def _sentences(self, n: int, rng: np.random.Generator) -> np.ndarray:
        succ = len(SUCCESSOR_PROBS)
        topic = rng.integers(0, self.n_topics, size=n)
        length = rng.integers(MIN_LEN, MAX_LEN + 1, size=n)
        words = np.empty((n, MAX_LEN), dtype=np.int64)
        words[:, 0] = self.starts[topic, rng.integers(0, self.start_per_topic, size=n)]
        draws = rng.choice(succ, size=(n, MAX_LEN - 1), p=SUCCESSOR_PROBS)
        for t in range(1, MAX_LEN):
            rot = self.rotation[words[:, t - 2]] if t >= 2 else 0
            words[:, t] = self.successors[topic, words[:, t - 1], (draws[:, t - 1] + rot) % succ]
        toks = np.full((n, MAX_LEN + 1), -1, dtype=np.int64)
        toks[:, :MAX_LEN] = words + 2  # word i has vocabulary id i + 2
        pos = np.arange(MAX_LEN + 1)[None, :]
        toks[pos > length[:, None]] = -1
        toks[pos == length[:, None]] = EOS_ID
        flat = toks.ravel()
        return flat[flat >= 0].astype(np.int32)

    # ------------------------------------------------------------------ facts
    def vocab(self) -> Vocab:
        """The vocabulary: ``<eos>``, ``<unk>``, ``w0``, ``w1``, ... (``<unk>`` never occurs)."""
        return Vocab([EOS, UNK, *(f"w{i}" for i in range(self.n_words))])

    def entropy_perplexity(self) -> float:
        """The perplexity of the true process (the floor any model can reach on a long stream).

        Entropy rate = E[information per sentence] / E[tokens per sentence]; per sentence: the first
        word (topic and start word, all distinct) ``ln(n_topics * start_words)``, the length
        ``ln(16)`` (revealed by where ``<eos>`` falls), and ``L - 1`` successor draws of entropy
        ``H(0.4, 0.3, 0.2, 0.1)`` each (successors are distinct, so every draw is a distinct word).
        """
        h_first = math.log(self.n_topics * self.start_per_topic)
        h_len = math.log(MAX_LEN - MIN_LEN + 1)
        h_step = float(-(SUCCESSOR_PROBS * np.log(SUCCESSOR_PROBS)).sum())
        mean_len = (MIN_LEN + MAX_LEN) / 2
        return math.exp((h_first + h_len + (mean_len - 1) * h_step) / (mean_len + 1))


def synthetic_corpus(
    seed: int = 1234,
    vocab_size: int = 512,
    n_train_tokens: int = 1_000_000,
    n_valid_tokens: int = 50_000,
    n_test_tokens: int = 50_000,
    n_topics: int = 8,
) -> Corpus:
    """Generate the synthetic corpus: same arguments give byte-identical arrays (about 0.2 s per 1M tokens).

    ``vocab_size`` counts ``<eos>`` and ``<unk>`` (so the default 512 is a round embedding size).
    ``meta["ideal_perplexity"]`` is the true process's perplexity, a floor for the validation perplexity.
    """
    lang = SyntheticLanguage(seed=seed, vocab_size=vocab_size, n_topics=n_topics)
    sizes = {"train": n_train_tokens, "valid": n_valid_tokens, "test": n_test_tokens}
    splits = {
        name: lang.generate(int(n), np.random.default_rng([lang.seed, _SPLIT_STREAM[name]]))
        for name, n in sizes.items()
    }
    return Corpus(
        name="synthetic",
        vocab=lang.vocab(),
        splits=splits,
        meta={
            "seed": lang.seed,
            "vocab_size": lang.vocab_size,
            "n_topics": lang.n_topics,
            "ideal_perplexity": lang.entropy_perplexity(),
        },
    )
