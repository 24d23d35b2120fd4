"""Train torchvision's ResNet-18 on an ImageFolder directory, FSDP2 over all ranks through exatrain.

    python examples/make_data.py images data/images                      # or your own ImageFolder
    exatrain run --nproc 2 examples/vision_resnet/train.py --data-dir data/images --steps 20 \\
        --checkpoint-interval 10

Checkpoints go to RUN_DIR/checkpoints/step-N; started again with the same --run-dir, the script resumes
from the newest one (also under another number of ranks) and continues to --steps. Every rank's loss,
averaged across ranks, is written to RUN_DIR/metrics.jsonl; rank 0 saves RUN_DIR/final.pt, a plain state
dict that loads into torchvision.models.resnet18(num_classes=...).
"""

import argparse
import functools
from pathlib import Path

import torch
import torch.nn.functional as F
import torchvision
from torchvision import datasets, transforms

import exatrain


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="ResNet-18 on an ImageFolder directory with FSDP2")
    parser.add_argument(
        "--data-dir", required=True, help="ImageFolder root: one sub-directory of images per class"
    )
    parser.add_argument(
        "--image-size", type=int, default=32, help="images are resized and centre-cropped to this"
    )
    parser.add_argument(
        "--steps", type=int, default=100, help="optimizer steps in total (a resumed run continues)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=64, help="global batch: images per step over all ranks"
    )
    parser.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (momentum 0.9)")
    parser.add_argument(
        "--norm",
        choices=["batch", "group"],
        default="batch",
        help="BatchNorm (torchvision's default; statistics per rank) or GroupNorm (32 groups)",
    )
    parser.add_argument(
        "--checkpoint-interval", type=int, default=0, help="checkpoint every N steps (0: never)"
    )
    parser.add_argument("--run-dir", default="runs/vision_resnet")
    parser.add_argument("--num-workers", type=int, default=0, help="data loading processes per rank")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    ctx = exatrain.init(
        seed=args.seed, dp_replicate=1, dp_shard=-1
    )  # FSDP2: parameters sharded over all ranks
    transform = transforms.Compose(
        [
            transforms.Resize(args.image_size),
            transforms.CenterCrop(args.image_size),
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )
    dataset = datasets.ImageFolder(args.data_dir, transform=transform)
    loader = exatrain.DataLoader(
        dataset, ctx, batch_size=args.batch_size, shuffle=True, seed=args.seed, num_workers=args.num_workers
    )

    norm_layer = functools.partial(torch.nn.GroupNorm, 32) if args.norm == "group" else None
    model = torchvision.models.resnet18(num_classes=len(dataset.classes), norm_layer=norm_layer)
    model = exatrain.parallelize(
        model, ctx
    )  # fully_shard on layer1..layer4 (found automatically), then the root
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    ckpt = exatrain.Checkpointer(
        args.run_dir, ctx, model=model, optimizer=optimizer, loader=loader, interval=args.checkpoint_interval
    )
    step = ckpt.resume()
    log = exatrain.MetricsLog(Path(args.run_dir) / "metrics.jsonl", resume_step=step)
    model.train()
    while step < args.steps:
        for images, labels in loader:
            images, labels = images.to(ctx.device), labels.to(ctx.device)
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            loss = exatrain.mean_across_ranks(loss.item())
            log.write(step=step, loss=loss)
            exatrain.print0(f"step {step}/{args.steps}  loss {loss:.4f}")
            ckpt.step(step)
            if step == args.steps:
                break
    ckpt.close()
    exatrain.save0(exatrain.full_state_dict(model), Path(args.run_dir) / "final.pt")
    ctx.close()


if __name__ == "__main__":
    main()
