"""Data and checkpoints (`exatrain data`, `exatrain checkpoint`): the last group of `exatrain --help`."""

from __future__ import annotations


def cmd_data(args, extra: list[str]) -> int:
    """`data prepare wikitext-2 --out DIR`: download on a machine with internet for offline training."""
    from exatrain.data.prepare import prepare_wikitext2

    out = prepare_wikitext2(args.out, url=args.url, timeout=args.timeout)
    print(f"WikiText-2 ready in {out}; train from it with --data.kind=wikitext --data.path={out}")
    return 0


def cmd_checkpoint(args, extra: list[str]) -> int:
    """`checkpoint export CKPT FILE`: the model of a sharded checkpoint as one file."""
    from exatrain.checkpoint import export_model

    out = export_model(args.checkpoint, args.output)
    print(f"wrote {out}; load it with torch.load(path, weights_only=True) or --checkpoint.init_from={out}")
    return 0
