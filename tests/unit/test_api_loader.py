"""exatrain.DataLoader's sample order and position, without a process group: which samples a data-parallel
rank gets depends only on (dp_rank, dp_size), given here by a stand-in for the Context (its two attributes);
tests/distributed/test_api.py runs the loader on real ranks."""

from types import SimpleNamespace

import pytest
import torch

from exatrain.data.loader import DataLoader
from exatrain.errors import DataError


class Indices(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def _ctx(rank, size):
    return SimpleNamespace(dp_rank=rank, dp_size=size)


def _epoch(loader):
    return [b.tolist() for b in loader]


def test_ranks_split_each_global_batch_of_one_process():
    one = _epoch(DataLoader(Indices(40), None, batch_size=8, seed=3))
    halves = [_epoch(DataLoader(Indices(40), _ctx(r, 2), batch_size=8, seed=3)) for r in range(2)]
    assert len(one) == 5 == len(halves[0])
    assert [a + b for a, b in zip(*halves)] == one
    assert sorted(sum(one, [])) == list(range(40)), "one epoch is a permutation of the dataset"


def test_epochs_reshuffle_and_set_epoch_is_reproducible():
    loader = DataLoader(Indices(40), None, batch_size=8, seed=3)
    first, second = _epoch(loader), _epoch(loader)
    assert first != second and loader.epoch == 2
    again = DataLoader(Indices(40), None, batch_size=8, seed=3)
    again.set_epoch(1)
    assert _epoch(again) == second


@pytest.mark.parametrize("workers", [0, 2])
def test_state_resumes_at_the_global_position_under_another_world_size(workers):
    full = _epoch(DataLoader(Indices(40), None, batch_size=8, seed=5))
    two = DataLoader(Indices(40), _ctx(1, 2), batch_size=8, seed=5, num_workers=workers)
    it = iter(two)
    for _ in range(2):  # workers prefetch further; the position counts what was handed out
        next(it)
    state = two.state_dict()
    assert (state["epoch"], state["consumed"]) == (0, 16)
    one = DataLoader(Indices(40), None, batch_size=8, seed=5)
    one.load_state_dict(state)
    assert _epoch(one) == full[2:]


def test_batch_not_divisible_by_ranks_is_a_data_error():
    with pytest.raises(DataError, match="HINT|divisible") as e:
        DataLoader(Indices(40), _ctx(0, 3), batch_size=8)
    assert "global batch" in str(e.value)
