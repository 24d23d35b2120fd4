"""Rank-aware, resumable sampling of training windows, with its position kept in global terms.

Each epoch is a permutation of the sample indices drawn from ``numpy.random.default_rng(seed + epoch)``,
identical on every rank without communication. An optimizer step consumes the next ``global_batch``
(G) entries of that permutation; rank ``r`` of ``W`` takes the contiguous slice ``[r*G/W, (r+1)*G/W)``
and yields it as ``G / (W * micro_batch)`` micro-batches (gradient accumulation). The position is
(epoch, samples of the epoch consumed), which does not depend on W: a run checkpointed on 4 ranks
resumes on 2 without skipping or repeating a sample.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from exatrain.data.windows import eval_batches, make_batch, num_eval_batches, num_windows, window
from exatrain.errors import DataError

__all__ = [
    "GlobalBatchSampler",
    "eval_batches",
    "make_batch",
    "num_eval_batches",
    "num_windows",
    "window",
]


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise DataError(f"{name} must be a positive integer, got {value!r}", f"set {name} to an integer >= 1")
    return int(value)


class GlobalBatchSampler:
    """Yields this rank's micro-batches (lists of sample indices), one global batch per optimizer step.

    ``num_samples``: windows in the split (see :func:`num_windows`); ``global_batch``: samples per
    optimizer step over all ranks; ``micro_batch``: samples per rank per forward pass (default: the
    whole per-rank share, i.e. no accumulation). ``shuffle=False`` keeps index order. With
    ``drop_last=True`` the ``num_samples % global_batch`` samples left at the end of an epoch are skipped
    (a different set each epoch when shuffling); with ``drop_last=False`` the last step is filled up
    with samples from the start of the epoch's order.

    Iterating goes from the current position to the end of the current epoch and then moves the
    position to the start of the next epoch. The position advances by one global batch when the
    step's last micro-batch is handed out, so :meth:`state_dict` taken between optimizer steps is
    exactly where a resumed run must continue.
    """

    def __init__(
        self,
        num_samples: int,
        global_batch: int,
        rank: int = 0,
        world_size: int = 1,
        micro_batch: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
    ):
        self.num_samples = _positive("num_samples", num_samples)
        self.global_batch = _positive("global batch size", global_batch)
        self.world_size = _positive("world size", world_size)
        if (
            isinstance(rank, bool)
            or not isinstance(rank, (int, np.integer))
            or not 0 <= rank < self.world_size
        ):
            raise DataError(
                f"rank {rank!r} is outside world size {world_size}", "pass 0 <= rank < world_size"
            )
        self.rank = int(rank)
        if micro_batch is None:
            micro_batch = max(1, self.global_batch // self.world_size)
        self.micro_batch = _positive("micro batch size", micro_batch)
        if self.global_batch % (self.world_size * self.micro_batch) != 0:
            raise DataError(
                f"global batch {self.global_batch} is not divisible by world size "
                f"{self.world_size} x micro batch "
                f"{self.micro_batch} = {self.world_size * self.micro_batch}: batch size not "
                "divisible as configured",
                "choose the global batch as a multiple of (number of ranks x micro batch), e.g. "
                f"{_round_up(self.global_batch, self.world_size * self.micro_batch)}, or change "
                "the micro batch",
            )
        if self.num_samples < self.global_batch:
            raise DataError(
                f"the corpus has {self.num_samples} training windows, fewer than one global batch of "
                f"{self.global_batch}: corpus too small",
                "use more training data, a smaller global batch, or a shorter data.seq_len",
            )
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self.consumed = 0
        self._perm: tuple[int, int, np.ndarray] | None = None

    # ------------------------------------------------------------------ sizes
    @property
    def per_rank(self) -> int:
        """Samples each rank processes per optimizer step (``global_batch / world_size``)."""
        return self.global_batch // self.world_size

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step on each rank."""
        return self.per_rank // self.micro_batch

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps in a full epoch."""
        if self.drop_last:
            return self.num_samples // self.global_batch
        return -(-self.num_samples // self.global_batch)

    def __len__(self) -> int:
        """Micro-batches this rank yields in a full epoch."""
        return self.steps_per_epoch * self.accumulation_steps

    def remaining_steps(self) -> int:
        """Optimizer steps left in the current epoch from the current position."""
        left = self.num_samples - self.consumed
        return left // self.global_batch if self.drop_last else -(-left // self.global_batch)

    # ------------------------------------------------------------------ order
    def permutation(self, epoch: int) -> np.ndarray:
        """The global sample order of ``epoch`` (the same on every rank and for every world size)."""
        if self._perm is None or self._perm[:2] != (epoch, self.seed):
            if self.shuffle:
                perm = np.random.default_rng(self.seed + epoch).permutation(self.num_samples)
            else:
                perm = np.arange(self.num_samples)
            self._perm = (epoch, self.seed, perm)
        return self._perm[2]

    def global_batch_indices(self) -> np.ndarray:
        """All ``global_batch`` sample indices of the next optimizer step (every rank's share, in rank
        order)."""
        perm = self.permutation(self.epoch)
        idx = perm[self.consumed : self.consumed + self.global_batch]
        if idx.size < self.global_batch:  # drop_last=False: fill the last step from the epoch's start
            idx = np.concatenate([idx, perm[: self.global_batch - idx.size]])
        return idx

    def rank_micro_batches(self) -> list[list[int]]:
        """This rank's micro-batches for the next optimizer step (does not advance)."""
        share = self.global_batch_indices()[self.rank * self.per_rank : (self.rank + 1) * self.per_rank]
        m = self.micro_batch
        return [share[i : i + m].tolist() for i in range(0, self.per_rank, m)]

    # ------------------------------------------------------------------ position
    def _epoch_done(self) -> bool:
        return self.remaining_steps() == 0

    def _advance(self) -> None:
        self.consumed += self.global_batch
        if self._epoch_done():
            self.epoch += 1
            self.consumed = 0

    def set_epoch(self, epoch: int) -> None:
        """Move to the start of ``epoch`` (no-op if already in it, so resuming mid-epoch keeps its place)."""
        if epoch != self.epoch:
            self.epoch = int(epoch)
            self.consumed = 0

    def __iter__(self) -> Iterator[list[int]]:
        """This rank's micro-batches from the current position to the end of the current epoch."""
        epoch = self.epoch
        while self.epoch == epoch and not self._epoch_done():
            mbs = self.rank_micro_batches()
            for j, mb in enumerate(mbs):
                if j == len(mbs) - 1:
                    self._advance()
                yield mb

    def iter_steps(self, num_steps: int | None = None) -> Iterator[list[list[int]]]:
        """Per optimizer step, this rank's list of micro-batches; crosses epochs; endless if ``num_steps`` is
        None."""
        done = 0
        while num_steps is None or done < num_steps:
            mbs = self.rank_micro_batches()
            self._advance()
            done += 1
            yield mbs

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, int]:
        """The position in global terms: epoch, samples of it consumed, seed (plus num_samples as a check)."""
        return {
            "epoch": self.epoch,
            "consumed": self.consumed,
            "seed": self.seed,
            "num_samples": self.num_samples,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` taken at any world size / micro batch (same corpus and
        seq_len)."""
        try:
            epoch, consumed = int(state["epoch"]), int(state["consumed"])
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(
                f"sampler state {state!r} lacks integer 'epoch' and 'consumed'",
                "resume from a checkpoint written by exatrain, or start a fresh run",
            ) from exc
        n = state.get("num_samples", self.num_samples)
        if n != self.num_samples:
            raise DataError(
                f"the checkpoint's data had {n} training windows, this run has {self.num_samples}",
                "resume with the same corpus and data.seq_len as the checkpointed run, or start a fresh run",
            )
        if epoch < 0 or not 0 <= consumed <= self.num_samples:
            raise DataError(
                f"sampler state epoch={epoch}, consumed={consumed} is invalid for {self.num_samples} samples",
                "resume from an intact checkpoint, or start a fresh run",
            )
        self.seed = int(state.get("seed", self.seed))
        self.epoch, self.consumed = epoch, consumed
        if self._epoch_done():
            self.epoch, self.consumed = epoch + 1, 0


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m
