"""A stand-in for torch 2.4's torchrun (the oldest torch pyproject.toml allows), whose wheel is not installed
here: run24.py reproduces its command line and signal behaviour, overlay.py makes a job see it."""
