"""User scripts that misuse exatrain's public API, one per case (run by test_api_bad_input.py).

python api_bad_input.py CASE RUN_DIR
"""

import sys

import torch
from torch import nn

import exatrain


class Old(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder, self.head = nn.Linear(4, 8), nn.Linear(8, 1)


class New(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder, self.decoder = nn.Linear(4, 8), nn.Linear(8, 1)


def no_blocks(run_dir):
    ctx = exatrain.init(quiet=True)
    exatrain.parallelize(
        nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)), ctx, activation_checkpoint="full"
    )


def init_twice(run_dir):
    exatrain.init(quiet=True)
    exatrain.init(quiet=True)


def checkpoint_of_another_model(run_dir):
    with exatrain.init(quiet=True) as ctx:
        old = Old()
        exatrain.Checkpointer(
            run_dir, ctx, model=old, optimizer=torch.optim.SGD(old.parameters(), lr=0.1)
        ).save(5)
        new = New()
        exatrain.Checkpointer(
            run_dir, ctx, model=new, optimizer=torch.optim.SGD(new.parameters(), lr=0.1)
        ).resume()


if __name__ == "__main__":
    globals()[sys.argv[1]](sys.argv[2])
