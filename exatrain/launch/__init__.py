"""Launching: local multi-process runs (torchrun's elastic agent). Never imports torch."""

from exatrain.launch.local import check_nproc, launch_local, torchrun_command

__all__ = ["check_nproc", "launch_local", "torchrun_command"]
