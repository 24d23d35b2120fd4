"""Launching: job specs, site profiles, sbatch scripts, billing, submission, local multi-process runs.

Never imports torch. Names are loaded on first use (PEP 562), so `exatrain sbatch` pays only for the
modules it needs.
"""

from importlib import import_module

_WHERE = {
    "check_nproc": "local", "launch_local": "local", "torchrun_command": "local",
    "CostEstimate": "billing", "estimate_cost": "billing",
    "BillingRule": "profiles", "SiteProfile": "profiles", "bundled_profiles": "profiles", "load_profile": "profiles",
    "render_sbatch": "sbatch", "sbatch_flags": "sbatch",
    "JobSpec": "spec",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'exatrain.launch' has no attribute {name!r}")
    return getattr(import_module(f"exatrain.launch.{_WHERE[name]}"), name)
