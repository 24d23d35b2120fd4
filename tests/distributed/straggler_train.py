"""The reference trainer with one slow rank, for tests/distributed/test_stragglers.py; started with
`exatrain run --nproc 2 straggler_train.py TRAIN-OVERRIDES...`. Rank SLOW_RANK sleeps 0.3 s at the start
of every step's data phase (inside `Trainer._micro_batches`, which the trainer times as phase "data"):
a stand-in for a rank whose file system or data pipeline is slow. It does not reproduce a slow GPU (a
compute-side straggler, which exatrain does not tell apart: docs/hangs.md)."""

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


if __name__ == "__main__":
    if int(os.environ["RANK"]) == SLOW_RANK:
        _slow_data()
    sys.exit(main(["train", *sys.argv[1:]]))
