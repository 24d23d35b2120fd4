"""SLURM jobs: job specs, site profiles (profiles/*.toml), sbatch scripts, submission through an injected
runner, billing, sweeps, requeue, containers and CPU binding.

Never imports torch, so submitting from a login node stays instant. Names are loaded on first use (PEP 562),
so `exatrain sbatch` pays only for the modules it needs.
"""

from exatrain._lazy import lazy_exports

_WHERE = {
    "CostEstimate": "billing",
    "estimate_cost": "billing",
    "BillingRule": "profiles",
    "SiteProfile": "profiles",
    "bundled_profiles": "profiles",
    "load_profile": "profiles",
    "render_sbatch": "sbatch",
    "sbatch_flags": "sbatch",
    "JobSpec": "spec",
}
__all__ = sorted(_WHERE)


_EXPORTS = {name: f"exatrain.slurm.{module}" for name, module in _WHERE.items()}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
