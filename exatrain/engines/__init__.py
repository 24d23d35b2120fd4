"""Outside training engines, one package each holding all of it (config, setup, step, checkpoints):
deepspeed/ and horovod/, as Lightning's strategies and torchtitan's components are organised.

protocol.py is the Engine protocol the reference trainer drives, optim.py the optimizer and schedule every
engine builds from `[train]`. Importing an engine's package imports nothing of the engine itself; its
modules import DeepSpeed or Horovod only where used.
"""
