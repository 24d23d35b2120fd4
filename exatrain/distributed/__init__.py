"""Process groups, devices and rank-aware helpers on top of torch.distributed."""

from exatrain.distributed.collectives import (
    all_gather_objects, all_ranks, any_rank, barrier, is_root, mean_across_ranks, print0, rank, save0, sum_across_ranks, world_size,
)
from exatrain.distributed.process_group import DistContext, init_distributed, select_backend, select_device, teardown
from exatrain.distributed.seed import rank_seed, seed_everything

__all__ = [
    "DistContext", "all_gather_objects", "all_ranks", "any_rank", "barrier", "init_distributed", "is_root", "mean_across_ranks", "print0",
    "rank", "rank_seed", "save0", "seed_everything", "select_backend", "select_device", "sum_across_ranks",
    "teardown", "world_size",
]
