"""`exatrain.DataLoader`: a distributed, resumable loader for any map-style dataset.

Built on torchdata's StatefulDataLoader (workers, prefetching, pinning, collate) with exatrain's
GlobalBatchSampler choosing the samples: every step takes the next `batch_size` entries of the epoch's
permutation (seeded by seed + epoch, the same on every rank) and data-parallel rank r of W gets the r-th
contiguous slice. The position is kept in global samples (epoch, samples consumed) and counts only the
batches handed to the caller (not those prefetched by workers), so a state_dict taken between steps
resumes exactly there, under any number of ranks.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterator

from torchdata.stateful_dataloader import StatefulDataLoader

from exatrain.data.sampler import GlobalBatchSampler
from exatrain.errors import DataError
from exatrain.observe import heartbeat

# torchdata 0.11 calls torch.set_vital, deprecated in torch 2.13, each time an iterator starts
warnings.filterwarnings("ignore", message="'set_vital' is deprecated")


class _EpochBatches:
    """The batch sampler StatefulDataLoader draws from: this rank's share of each remaining global batch
    of the current epoch, starting at the loader's position."""

    def __init__(self, sampler: GlobalBatchSampler):
        self.sampler = sampler

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.sampler)

    def __len__(self) -> int:
        return self.sampler.steps_per_epoch


class DataLoader(StatefulDataLoader):
    """Iterating gives this rank's share (batch_size / data-parallel ranks samples) of each global batch,
    from the current position to the end of the epoch; iterate again for the next epoch (or call
    `set_epoch(e)` first). `len(loader)` is the number of steps per epoch."""

    def __init__(
        self,
        dataset,
        ctx=None,
        batch_size: int = 32,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        num_workers: int = 0,
        collate_fn=None,
        **kwargs,
    ):
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise DataError(
                "exatrain.DataLoader needs a map-style dataset (len() and [i]), got "
                f"{type(dataset).__name__}",
                "wrap the data in a torch.utils.data.Dataset with __len__ and __getitem__",
            )
        rank, size = (ctx.dp_rank, ctx.dp_size) if ctx is not None else (0, 1)
        self.global_sampler = GlobalBatchSampler(
            num_samples=len(dataset),
            global_batch=batch_size,
            rank=rank,
            world_size=size,
            seed=seed,
            shuffle=shuffle,
            drop_last=drop_last,
        )
        self.batch_size_global = batch_size
        self._position = (0, 0)  # (epoch, consumed) after the last batch handed out
        super().__init__(
            dataset,
            batch_sampler=_EpochBatches(self.global_sampler),
            num_workers=num_workers,
            collate_fn=collate_fn,
            **kwargs,
        )

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from."""
        return self._position[0]

    def set_epoch(self, epoch: int) -> None:
        """Move to the start of `epoch`; a no-op inside that epoch, so a resumed run keeps its place."""
        if epoch != self._position[0]:
            self._position = (int(epoch), 0)

    def __iter__(self):
        s = self.global_sampler
        s.epoch, s.consumed = self._position
        epoch, start = self._position
        batches = super().__iter__()
        for i in itertools.count():
            heartbeat.mark("data")  # waiting for a batch counts as the data phase of the hang watcher
            try:
                batch = next(batches)
            except StopIteration:
                return
            heartbeat.batch()  # a batch arrived: progress; the user's step runs until the next mark
            self._advance_to(epoch, start + (i + 1) * s.global_batch)
            yield batch

    def _advance_to(self, epoch: int, consumed: int) -> None:
        """Record the position after a batch handed out; the end of an epoch is the start of the next."""
        s = self.global_sampler
        left = s.num_samples - consumed
        more = left // s.global_batch if s.drop_last else -(-left // s.global_batch)
        self._position = (epoch, consumed) if more > 0 else (epoch + 1, 0)

    def state_dict(self) -> dict:
        """The position in global terms (epoch, samples consumed, seed): valid under any world size."""
        epoch, consumed = self._position
        return {
            "epoch": epoch,
            "consumed": consumed,
            "seed": self.global_sampler.seed,
            "num_samples": self.global_sampler.num_samples,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from a state_dict() taken under any number of ranks (same dataset length)."""
        s = self.global_sampler
        s.load_state_dict(state)  # checks it; moves past a finished epoch
        self._position = (s.epoch, s.consumed)
