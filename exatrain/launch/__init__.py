"""Starting processes: local runs under torchrun's elastic agent (local.py, agent.py) and `exatrain run`
(run.py: one rank inside a launcher; script_runner.py: the script as `python SCRIPT.py` would run it).

Never imports torch at import time. Names are loaded on first use (PEP 562).
"""

from exatrain._lazy import lazy_exports

_WHERE = {"check_nproc": "local", "launch_local": "local", "torchrun_command": "local"}
__all__ = sorted(_WHERE)


_EXPORTS = {name: f"exatrain.launch.{module}" for name, module in _WHERE.items()}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
