"""Training data: corpora (synthetic, WikiText, raw text), a tokenised cache, and rank-aware sampling.

Typical use::

    corpus = load_corpus("synthetic", None, cache_dir)          # or "wikitext"/"text" with a directory
    train = corpus.split("train")
    sampler = GlobalBatchSampler(
        num_windows(len(train), seq_len), global_batch, rank, world_size, micro_batch
    )
    for indices in sampler:
        x, y = make_batch(train, indices, seq_len)
"""

from exatrain.data.cache import cache_key, cached_corpus
from exatrain.data.corpus import SPLITS, Corpus
from exatrain.data.loading import KINDS, load_corpus
from exatrain.data.prepare import WIKITEXT2_FILES, WIKITEXT2_URLS, prepare_wikitext2
from exatrain.data.rawtext import load_text_dir
from exatrain.data.sampler import GlobalBatchSampler
from exatrain.data.synthetic import SyntheticLanguage, synthetic_corpus
from exatrain.data.vocab import EOS, EOS_ID, UNK, UNK_ID, Vocab
from exatrain.data.wikitext import load_wikitext
from exatrain.data.windows import eval_batches, make_batch, num_eval_batches, num_windows, window

__all__ = [
    "EOS",
    "EOS_ID",
    "KINDS",
    "SPLITS",
    "UNK",
    "UNK_ID",
    "WIKITEXT2_FILES",
    "WIKITEXT2_URLS",
    "Corpus",
    "GlobalBatchSampler",
    "SyntheticLanguage",
    "Vocab",
    "cache_key",
    "cached_corpus",
    "eval_batches",
    "load_corpus",
    "load_text_dir",
    "load_wikitext",
    "make_batch",
    "num_eval_batches",
    "num_windows",
    "prepare_wikitext2",
    "synthetic_corpus",
    "window",
]
