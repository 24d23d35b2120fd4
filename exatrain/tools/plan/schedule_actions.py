"""One pipeline rank's actions in a step of torch's interleaved 1F1B schedule, as torch lowers them for FSDP.

Why: under an interleaved schedule FSDP's gathers depend on the order in which a rank runs its stages'
forwards and backwards and on the whole-stage UNSHARD/RESHARD actions torch adds for FSDP stages; only
that order gives their count (analytic.py's `_fsdp_interleaved`). The order is torch's own: its schedule
class computes each rank's compute actions, `_add_unshard_reshard` adds the UNSHARD/RESHARD actions (at
most three stages gathered at once) and `_add_reduce_grad` one REDUCE_GRAD after each stage's last
backward, as `_PipelineScheduleRuntime` does before a step. These are private functions of
torch.distributed.pipelining.schedules: `tests/unit/test_plan_search.py` checks the counts they give
against a measured step, which fails if torch changes them.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace


@functools.lru_cache(maxsize=256)
def rank_actions(pp: int, chunks: int, microbatches: int, pp_rank: int) -> tuple[tuple[str, int], ...]:
    """(kind, stage index) of every action `pp_rank` runs in one step of ScheduleInterleaved1F1B with
    `chunks` stages per rank and `microbatches` pipeline microbatches, in order; kinds are the names of
    torch's _ComputationType: FORWARD, FULL_BACKWARD, UNSHARD, RESHARD, REDUCE_GRAD."""
    from torch.distributed.pipelining import schedules

    rounds = max(1, microbatches // pp)
    schedule = SimpleNamespace(
        n_local_stages=chunks,
        pp_group_size=pp,
        _n_microbatches=microbatches,
        number_of_rounds=rounds,
        microbatches_per_round=microbatches // rounds,
    )
    compute = schedules.ScheduleInterleaved1F1B._calculate_single_rank_operations(schedule, pp_rank)
    lowered = schedules._add_reduce_grad(schedules._add_unshard_reshard(compute), microbatches)
    return tuple((a.computation_type.name, a.stage_index) for a in lowered if a is not None)
