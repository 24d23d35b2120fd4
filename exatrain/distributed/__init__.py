"""Process groups, devices and rank-aware helpers on top of torch.distributed.

Names are imported lazily (PEP 562), as in `exatrain` itself: importing a torch-free submodule
(`exatrain.distributed.parallel_dims`) does not import torch, so the launching process can check a layout
without paying for torch before its workers start.
"""

from __future__ import annotations

from exatrain._lazy import lazy_exports

#: name -> the submodule that defines it
_EXPORTS = {
    **dict.fromkeys(
        [
            "all_gather_objects",
            "all_ranks",
            "any_rank",
            "barrier",
            "is_root",
            "mean_across_ranks",
            "print0",
            "rank",
            "save0",
            "sum_across_ranks",
            "world_size",
        ],
        "exatrain.distributed.collectives",
    ),
    **dict.fromkeys(
        ["DistContext", "init_distributed", "select_backend", "select_device", "teardown"],
        "exatrain.distributed.process_group",
    ),
    **dict.fromkeys(["rank_seed", "seed_everything"], "exatrain.distributed.seed"),
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
