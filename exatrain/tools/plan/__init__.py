"""`exatrain plan`: validate a parallel layout for a world size in one process and estimate memory per GPU;
measure the collectives of one step (comm.py) and predict the step time from hardware constants
(estimate.py, docs/planning.md).

Imports torch (lazily through `make_plan`'s modules); the CLI imports it only when the subcommand runs.
"""

from exatrain.tools.plan.planner import Plan, RankPlan, make_plan

__all__ = ["Plan", "RankPlan", "make_plan"]
