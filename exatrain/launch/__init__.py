"""Launching: local multi-process runs (torchrun's elastic agent). Never imports torch."""

from exatrain.launch.local import check_nproc, launch_local, torchrun_command
from exatrain.launch.billing import CostEstimate, estimate_cost
from exatrain.launch.profiles import BillingRule, SiteProfile, bundled_profiles, load_profile
from exatrain.launch.sbatch import render_sbatch, sbatch_flags
from exatrain.launch.spec import JobSpec

__all__ = [
    "check_nproc", "launch_local", "torchrun_command",
    "BillingRule", "CostEstimate", "JobSpec", "SiteProfile", "bundled_profiles", "estimate_cost", "load_profile",
    "render_sbatch", "sbatch_flags",
]
