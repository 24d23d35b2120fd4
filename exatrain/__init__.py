"""exatrain: PyTorch training from one CPU to thousands of GPUs on SLURM clusters, wired right by default."""

__version__ = "0.1.0"
