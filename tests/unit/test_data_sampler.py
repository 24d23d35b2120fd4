"""GlobalBatchSampler (coverage, world-size independence, resume), windows and evaluation shards."""

import numpy as np
import pytest
import torch

from exatrain.data import GlobalBatchSampler, eval_batches, make_batch, num_eval_batches, num_windows, window
from exatrain.errors import DataError


def run_epoch(n, G, W, micro, seed=0, epoch=0):
    """Per rank, the list of steps; each step = flat list of that rank's indices."""
    out = []
    for r in range(W):
        s = GlobalBatchSampler(n, G, rank=r, world_size=W, micro_batch=micro, seed=seed)
        s.set_epoch(epoch)
        steps, cur = [], []
        for mb in s:
            assert len(mb) == micro
            cur += mb
            if len(cur) == G // W:
                steps.append(cur)
                cur = []
        assert cur == []
        assert len(steps) == s.steps_per_epoch
        out.append(steps)
    return out


@pytest.mark.parametrize("W,micro", [(1, 4), (2, 2), (4, 1), (4, 2)])
def test_every_sample_exactly_once_per_epoch(W, micro):
    n, G = 96, 16
    ranks = run_epoch(n, G, W, micro)
    seen = [i for steps in ranks for step in steps for i in step]
    assert sorted(seen) == list(range(n))


def test_global_batches_do_not_depend_on_world_size():
    n, G = 120, 24
    single = run_epoch(n, G, 1, 6)[0]
    for W, micro in [(2, 3), (3, 4), (4, 6)]:
        ranks = run_epoch(n, G, W, micro)
        for s, step in enumerate(single):
            union = [i for r in range(W) for i in ranks[r][s]]
            assert union == step  # rank r holds the r-th contiguous slice of the same global batch
    # the order is shuffled, differs per epoch, and is reproducible
    assert single[0] != list(range(24))
    assert run_epoch(n, G, 1, 6, epoch=1)[0] != single
    assert run_epoch(n, G, 1, 6)[0] == single


def test_drop_last_and_padding():
    s = GlobalBatchSampler(50, 16, seed=1)
    assert s.steps_per_epoch == 3 and len(s) == 3
    seen = [i for mb in s for i in mb]
    assert len(seen) == 48 == len(set(seen))
    p = GlobalBatchSampler(50, 16, seed=1, drop_last=False)
    assert p.steps_per_epoch == 4
    seen = [i for mb in p for i in mb]
    assert len(seen) == 64 and set(seen) == set(range(50))


def test_iteration_rolls_over_to_the_next_epoch_and_set_epoch():
    s = GlobalBatchSampler(32, 8, seed=3)
    first = [tuple(mb) for mb in s]
    assert s.state_dict()["epoch"] == 1 and s.state_dict()["consumed"] == 0
    s.set_epoch(1)  # no-op: already there
    second = [tuple(mb) for mb in s]
    assert len(second) == 4 and second != first
    s.set_epoch(0)
    assert [tuple(mb) for mb in s] == first
    shuffled_off = GlobalBatchSampler(32, 8, shuffle=False)
    assert [i for mb in shuffled_off for i in mb] == list(range(32))


def _global_steps(samplers, steps):
    """The next `steps` global batches in order: rank r's micro-batches of a step are the r-th slice of it."""
    its = [s.iter_steps(steps) for s in samplers]
    return [[i for it in its for mb in next(it) for i in mb] for _ in range(steps)]


@pytest.mark.parametrize("W_save,W_resume", [(4, 2), (2, 4), (1, 4), (4, 1)])
def test_resume_mid_epoch_at_another_world_size(W_save, W_resume):
    n, G, done_steps = 128, 16, 3
    savers = [
        GlobalBatchSampler(n, G, rank=r, world_size=W_save, micro_batch=G // W_save // 2, seed=9)
        for r in range(W_save)
    ]
    before = _global_steps(savers, done_steps)
    states = [s.state_dict() for s in savers]
    assert all(st == states[0] for st in states)  # the position is global
    assert states[0] == {"epoch": 0, "consumed": done_steps * G, "seed": 9, "num_samples": n}

    resumed = []
    for r in range(W_resume):
        s = GlobalBatchSampler(n, G, rank=r, world_size=W_resume, micro_batch=1, seed=12345)
        s.load_state_dict(states[0])  # adopts the checkpoint's seed
        assert s.remaining_steps() == n // G - done_steps
        s.set_epoch(0)  # the usual epoch loop call must not rewind a resumed epoch
        resumed.append(s)
    after = _global_steps(resumed, n // G - done_steps)
    # exactly the steps of the uninterrupted single-rank run, in order: nothing skipped, repeated or reordered
    uninterrupted = _global_steps([GlobalBatchSampler(n, G, micro_batch=G, seed=9)], n // G)
    assert before + after == uninterrupted
    assert sorted(i for step in uninterrupted for i in step) == list(range(n))


def test_state_advances_only_when_a_step_is_complete():
    s = GlobalBatchSampler(64, 16, world_size=2, rank=0, micro_batch=2, seed=0)
    it = iter(s)
    for _ in range(s.accumulation_steps - 1):
        next(it)
        assert s.state_dict()["consumed"] == 0  # mid-step: a resume replays this step
    next(it)
    assert s.state_dict()["consumed"] == 16


def test_divisibility_and_size_errors():
    with pytest.raises(DataError) as e:
        GlobalBatchSampler(1000, 30, rank=0, world_size=4, micro_batch=2)
    msg = str(e.value)
    assert "global batch 30" in msg and "world size 4" in msg and "micro batch 2" in msg
    assert "not divisible as configured" in msg and "HINT:" in msg and "32" in msg
    with pytest.raises(DataError, match="corpus too small"):
        GlobalBatchSampler(10, 16)
    with pytest.raises(DataError, match="rank 2 is outside world size 2"):
        GlobalBatchSampler(100, 16, rank=2, world_size=2)
    with pytest.raises(DataError, match="global batch size must be a positive integer"):
        GlobalBatchSampler(100, 0)
    s = GlobalBatchSampler(100, 10)
    with pytest.raises(DataError, match="training windows"):
        s.load_state_dict({"epoch": 0, "consumed": 0, "seed": 0, "num_samples": 99})
    with pytest.raises(DataError, match="lacks integer"):
        s.load_state_dict({"epoch": 0})


# ---------------------------------------------------------------- windows and batches
def test_windows_and_make_batch():
    tokens = np.arange(23, dtype=np.int32)
    assert num_windows(len(tokens), 5) == 4  # windows of 6 tokens sharing one: 0..5, 5..10, 10..15, 15..20
    x, y = window(tokens, 2, 5)
    assert x.tolist() == [10, 11, 12, 13, 14] and y.tolist() == [11, 12, 13, 14, 15]
    xb, yb = make_batch(tokens, [3, 0], 5)
    assert xb.dtype == torch.int64 and xb.shape == (2, 5) and xb.is_contiguous() and yb.is_contiguous()
    assert xb[0].tolist() == [15, 16, 17, 18, 19] and yb[0].tolist() == [16, 17, 18, 19, 20]
    assert torch.equal(xb[1], torch.arange(5))
    with pytest.raises(DataError, match="out of range"):
        make_batch(tokens, [4], 5)
    with pytest.raises(DataError, match="out of range"):
        window(tokens, -1, 5)
    with pytest.raises(DataError, match="sequence length"):
        num_windows(10, 0)


def test_make_batch_from_a_readonly_memmap(tmp_path):
    np.save(tmp_path / "t.npy", np.arange(100, dtype=np.int32))
    mm = np.load(tmp_path / "t.npy", mmap_mode="r")
    x, y = make_batch(mm, np.array([1, 2]), 8)
    assert x[0, 0].item() == 8 and y[1, -1].item() == 24


def test_eval_batches_equal_counts_and_contiguous_shards():
    tokens = np.arange(10 * 7 + 1 + 3, dtype=np.int32)  # 10 windows of 7+1 (and a few spare tokens)
    assert num_eval_batches(len(tokens), 7, 2, world_size=1) == 5
    for W in (1, 2, 3, 4):
        per_rank = [list(eval_batches(tokens, 7, 2, rank=r, world_size=W)) for r in range(W)]
        counts = {len(b) for b in per_rank}
        assert counts == {5 // W}  # same number on every rank; remainder dropped
        firsts = [x[:, 0].tolist() for b in per_rank for x, _ in b]
        flat = [v for f in firsts for v in f]
        assert flat == [7 * i for i in range(len(flat))]  # rank order = window order
    capped = list(eval_batches(tokens, 7, 2, rank=1, world_size=2, max_batches=1))
    assert len(capped) == 1 and capped[0][0][0, 0].item() == 7 * 2
    assert num_eval_batches(len(tokens), 7, 2, world_size=2, max_total_batches=2) == 1
    assert num_eval_batches(len(tokens), 7, 1, world_size=4, max_total_batches=2) == 1
    with pytest.raises(DataError, match="too small for one batch") as e:
        eval_batches(tokens, 7, 4, rank=0, world_size=3)
    assert "HINT:" in str(e.value)
