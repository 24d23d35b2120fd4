"""Fixed-length training windows over a token stream, and batches of them as tensors.

Sample ``i`` of a split is ``tokens[i*T : i*T + T + 1]`` (``T = seq_len``): non-overlapping inputs, each
window one token longer so that input ``x = w[:-1]`` and target ``y = w[1:]`` (next-token prediction).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from exatrain.errors import DataError

if TYPE_CHECKING:
    import torch


def num_windows(n_tokens: int, seq_len: int) -> int:
    """How many samples of ``seq_len + 1`` tokens a stream of ``n_tokens`` holds (windows share one token)."""
    if seq_len < 1:
        raise DataError(
            f"sequence length {seq_len} must be >= 1", "set data.seq_len to a positive number of tokens"
        )
    return max(0, (int(n_tokens) - 1) // seq_len)


def window(tokens: np.ndarray, index: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Input and target arrays (``seq_len`` tokens each) of sample ``index``."""
    n = num_windows(len(tokens), seq_len)
    if not 0 <= index < n:
        raise DataError(
            f"sample index {index} out of range: {len(tokens)} tokens hold {n} windows of {seq_len}+1",
            "use indices from a sampler built with num_samples = num_windows(len(tokens), seq_len)",
        )
    w = np.asarray(tokens[index * seq_len : index * seq_len + seq_len + 1], dtype=np.int64)
    return w[:-1], w[1:]


def make_batch(tokens: np.ndarray, indices: Sequence[int], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack samples ``indices`` into LongTensors ``x`` and ``y`` of shape [len(indices), seq_len] (CPU).

    torch is imported here, not at module level, so ``import exatrain.data`` stays light for commands
    such as ``exatrain data prepare`` on login nodes.
    """
    import torch

    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    n = num_windows(len(tokens), seq_len)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise DataError(
            f"sample indices {int(idx.min())}..{int(idx.max())} out of range: {len(tokens)} tokens hold {n} "
            f"windows of {seq_len}+1",
            "build the sampler with num_samples = num_windows(len(tokens), seq_len) for the same "
            "split and seq_len",
        )
    rows = np.asarray(tokens[idx[:, None] * seq_len + np.arange(seq_len + 1)], dtype=np.int64)
    t = torch.from_numpy(rows)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def num_eval_batches(
    n_tokens: int,
    seq_len: int,
    batch: int,
    world_size: int = 1,
    max_batches: int | None = None,
    max_total_batches: int | None = None,
) -> int:
    """Batches every rank gets from :func:`eval_batches` (identical on all ranks).

    ``max_batches`` caps each rank; ``max_total_batches`` caps the sum over ranks (at least one per rank);
    0 or None means no cap.
    """
    if batch < 1 or world_size < 1:
        raise DataError(
            f"evaluation batch {batch} and world size {world_size} must be >= 1",
            "set a positive batch size",
        )
    per_rank = num_windows(n_tokens, seq_len) // batch // world_size
    if max_batches:
        per_rank = min(per_rank, max_batches)
    if max_total_batches:
        per_rank = min(per_rank, max(1, max_total_batches // world_size))
    return per_rank


def eval_batches(
    tokens: np.ndarray,
    seq_len: int,
    batch: int,
    rank: int = 0,
    world_size: int = 1,
    max_batches: int | None = None,
    max_total_batches: int | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's evaluation batches: contiguous shards, the same count on every rank.

    The split's windows are cut into batches of ``batch``; with ``nb`` batches per rank (all that fit
    evenly, at most ``max_batches``, and at most ``max_total_batches // world_size`` but at least one;
    0/None = no cap) rank ``r`` takes global batches
    ``[r*nb, (r+1)*nb)``. The remainder is dropped, so collectives after each batch stay in step and
    the evaluated windows are the first ``nb * world_size * batch`` ones whatever the world size.
    Raises DataError (eagerly) if not even one batch per rank fits.
    """
    if not 0 <= rank < world_size:
        raise DataError(f"rank {rank} is outside world size {world_size}", "pass 0 <= rank < world_size")
    nb = num_eval_batches(len(tokens), seq_len, batch, world_size, max_batches, max_total_batches)
    if nb == 0:
        raise DataError(
            f"evaluation split of {len(tokens)} tokens is too small for one batch of {batch} windows of "
            f"{seq_len}+1 tokens on each of {world_size} ranks",
            "use a smaller evaluation batch or data.seq_len, fewer ranks, or a larger validation split",
        )

    def gen() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        first = rank * nb * batch
        for b in range(nb):
            start = first + b * batch
            yield make_batch(tokens, range(start, start + batch), seq_len)

    return gen()
