"""The reference trainer with one slow rank, for tests/distributed/test_stragglers.py; started with
`exatrain run --nproc 2 straggler_train.py WHERE TRAIN-OVERRIDES...`. Rank SLOW_RANK sleeps 0.3 s in every
step, where WHERE says:

- `data`: at the start of the step's data phase (inside `Trainer._micro_batches`, which the trainer times as
  phase "data"), a stand-in for a rank whose file system or data pipeline is slow;
- `compute`: in the model's forward (a forward pre-hook on the model's first block, so inside the trainer's
  forward_backward phase, before DDP's gradient all-reduce), a stand-in for a rank with a slow GPU or slow
  cores. It does not reproduce a GPU's asynchrony: on CPU the host clock is the compute clock, while on a
  GPU the slow kernels would run after the host has moved on (StepMetrics times that phase with CUDA
  events there, not tested here).
"""

import os
import sys
import time

from exatrain.cli.main import main
from exatrain.train.trainer import Trainer

SLOW_RANK, DELAY_S = 1, 0.3


def _slow_data() -> None:
    original = Trainer._micro_batches

    def micro_batches(self):
        time.sleep(DELAY_S)
        return original(self)

    Trainer._micro_batches = micro_batches


def _slow_compute() -> None:
    original = Trainer._train_steps

    def train_steps(self, *args, **kwargs):
        block = self.engine.model_parts[0].layers["0"]  # reached in every forward, before any gradient exists
        block.register_forward_pre_hook(lambda *_: time.sleep(DELAY_S))
        return original(self, *args, **kwargs)

    Trainer._train_steps = train_steps


if __name__ == "__main__":
    where, args = sys.argv[1], sys.argv[2:]
    if int(os.environ["RANK"]) == SLOW_RANK:
        {"data": _slow_data, "compute": _slow_compute}[where]()
    sys.exit(main(["train", *args]))
