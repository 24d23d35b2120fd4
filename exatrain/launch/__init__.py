"""Starting processes: local runs under torchrun's elastic agent (local.py, agent.py) and `exatrain run`
(run.py: one rank inside a launcher; script_runner.py: the script as `python SCRIPT.py` would run it).

Never imports torch at import time. Names are loaded on first use (PEP 562).
"""

from importlib import import_module

_WHERE = {"check_nproc": "local", "launch_local": "local", "torchrun_command": "local"}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'exatrain.launch' has no attribute {name!r}")
    return getattr(import_module(f"exatrain.launch.{_WHERE[name]}"), name)
