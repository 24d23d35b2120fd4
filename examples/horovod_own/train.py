"""Your own Horovod script on exatrain's launch path (no `horovodrun`, no MPI, no ssh).

    exatrain run --nproc 2 examples/horovod_own/train.py          # 2 local ranks
    srun exatrain run examples/horovod_own/train.py --epochs 3    # inside a SLURM job step
    python examples/horovod_own/train.py                          # one plain process (Horovod of size 1)

The shape of Horovod's own PyTorch examples (pytorch_mnist.py, pytorch_imagenet_resnet50.py), with one
change: `exatrain.init_horovod(ctx)` instead of `hvd.init()`. It hosts Horovod's gloo rendezvous on rank 0
and gives every rank the HOROVOD_* variables from exatrain's detected environment (srun, mpirun, torchrun,
`exatrain run`). The rest is plain Horovod: a DistributedSampler over hvd.size() ranks,
`hvd.broadcast_parameters`, `hvd.broadcast_optimizer_state`, `hvd.DistributedOptimizer` averaging the
gradients of `--batches-per-allreduce` backward passes (Horovod's gradient accumulation), the loss averaged
by `hvd.allreduce`. The model is a small MLP regression on synthetic data. Rank 0 writes --out (JSON): the
loss of every step and the settings it ran with.
"""

import argparse
import json
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import exatrain


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=64, help="size of the synthetic dataset")
    p.add_argument("--batch-size", type=int, default=4, help="samples per backward pass on each rank")
    p.add_argument(
        "--batches-per-allreduce",
        type=int,
        default=2,
        help="backward passes per optimizer step (Horovod's backward_passes_per_step)",
    )
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--out", default="horovod-own.json", help="rank 0 writes the losses here")
    return p.parse_args()


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))


def make_dataset(samples: int) -> TensorDataset:
    """The same synthetic regression data on every rank (a fixed target function plus noise)."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, 16, generator=g)
    y = torch.sin(x[:, :4].sum(dim=1, keepdim=True)) + 0.01 * torch.randn(samples, 1, generator=g)
    return TensorDataset(x, y)


def check_sizes(samples: int, per_step: int, ranks: int) -> None:
    """Every rank takes the same number of full steps from every epoch (no padded or dropped samples)."""
    if samples % (per_step * ranks):
        raise SystemExit(
            f"--samples={samples} is not a multiple of --batch-size x --batches-per-allreduce x ranks "
            f"({per_step} x {ranks}). HINT: pass a --samples that is a multiple of {per_step * ranks}"
        )


def main():
    args = parse_args()
    with exatrain.init(seed=0) as ctx:
        hvd = exatrain.init_horovod(ctx)  # instead of hvd.init(): rendezvous and ranks from exatrain
        per_step = args.batch_size * args.batches_per_allreduce
        check_sizes(args.samples, per_step, hvd.size())
        dataset = make_dataset(args.samples)
        sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=0)
        loader = DataLoader(dataset, batch_size=per_step, sampler=sampler)

        model = make_model().to(ctx.device)
        # (Horovod's examples multiply lr by hvd.size(); --lr is used as given here)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            backward_passes_per_step=args.batches_per_allreduce,
        )

        losses = []
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                x, y = x.to(ctx.device), y.to(ctx.device)
                optimizer.zero_grad()
                step_loss = 0.0
                for i in range(0, len(x), args.batch_size):  # one backward pass per --batch-size samples
                    loss = nn.functional.mse_loss(
                        model(x[i : i + args.batch_size]), y[i : i + args.batch_size]
                    )
                    loss = loss / args.batches_per_allreduce
                    loss.backward()
                    step_loss += loss.item()
                optimizer.step()  # gradients averaged over the ranks by Horovod's allreduce
                losses.append(hvd.allreduce(torch.tensor(step_loss), name="loss").item())
                exatrain.print0(f"epoch {epoch + 1} step {len(losses):>3}  loss {losses[-1]:.6f}")

        if hvd.rank() == 0:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(
                json.dumps(
                    {
                        "losses": losses,
                        "size": hvd.size(),
                        "local_size": hvd.local_size(),
                        "batch_size": args.batch_size,
                        "batches_per_allreduce": args.batches_per_allreduce,
                        "samples": args.samples,
                    }
                )
            )


if __name__ == "__main__":
    main()
