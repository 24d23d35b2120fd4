"""Horovod on exatrain's launch path: setup (hvd.init from the detected environment) and engine (the trainer's
step)."""
