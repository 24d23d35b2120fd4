"""SLURM jobs: job specs, site profiles (profiles/*.toml), sbatch scripts, submission through an injected
runner, billing, sweeps, requeue, containers and CPU binding.

Never imports torch, so submitting from a login node stays instant. Names are loaded on first use (PEP 562),
so `exatrain sbatch` pays only for the modules it needs.
"""

from importlib import import_module

_WHERE = {
    "CostEstimate": "billing", "estimate_cost": "billing",
    "BillingRule": "profiles", "SiteProfile": "profiles", "bundled_profiles": "profiles", "load_profile": "profiles",
    "render_sbatch": "sbatch", "sbatch_flags": "sbatch",
    "JobSpec": "spec",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'exatrain.slurm' has no attribute {name!r}")
    return getattr(import_module(f"exatrain.slurm.{_WHERE[name]}"), name)
