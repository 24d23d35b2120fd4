"""Train a Hugging Face causal LM built from a config (nothing downloaded), FSDP2 per decoder layer.

    python examples/make_data.py wikitext data/wikitext-2                  # or the real WikiText-2
    HF_HUB_OFFLINE=1 exatrain run --nproc 2 examples/hf_causal_lm/train.py --data-dir data/wikitext-2 \\
        --steps 20 --checkpoint-interval 10

The model is a small Llama (transformers' LlamaForCausalLM) with randomly initialised weights, on the bytes
of the training text (a vocabulary of 256: no tokenizer to download). exatrain.parallelize finds the
decoder layers (model.model.layers) and shards each of them, then the root, with FSDP2. Checkpoints go to
RUN_DIR/checkpoints/step-N; started again with the same --run-dir, under any number of ranks, the script
resumes from the newest one and continues to --steps. The loss averaged across ranks goes to
RUN_DIR/metrics.jsonl; rank 0 saves RUN_DIR/final.pt, a plain state dict of the LlamaForCausalLM.
"""

import argparse
from pathlib import Path

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM

import exatrain


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Llama-style causal LM from a config, FSDP2 per decoder layer"
    )
    parser.add_argument("--data-dir", required=True, help="directory with train.txt or wiki.train.tokens")
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4, help="decoder layers")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--seq-len", type=int, default=128, help="bytes per training sequence")
    parser.add_argument(
        "--steps", type=int, default=100, help="optimizer steps in total (a resumed run continues)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=16, help="global batch: sequences per step over all ranks"
    )
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "--checkpoint-interval", type=int, default=0, help="checkpoint every N steps (0: never)"
    )
    parser.add_argument("--run-dir", default="runs/hf_causal_lm")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


class ByteSequences(Dataset):
    """Consecutive windows of the training text's UTF-8 bytes (token ids 0..255)."""

    def __init__(self, data_dir, seq_len):
        path = next(
            (p for p in (Path(data_dir) / "wiki.train.tokens", Path(data_dir) / "train.txt") if p.is_file()),
            None,
        )
        if path is None:
            raise SystemExit(f"no wiki.train.tokens or train.txt in {data_dir}")
        self.ids = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8).long()
        self.seq_len = seq_len

    def __len__(self):
        return len(self.ids) // self.seq_len

    def __getitem__(self, i):
        return self.ids[i * self.seq_len : (i + 1) * self.seq_len]


def main(argv=None):
    args = parse_args(argv)
    ctx = exatrain.init(
        seed=args.seed, dp_replicate=1, dp_shard=-1
    )  # FSDP2: parameters sharded over all ranks
    loader = exatrain.DataLoader(
        ByteSequences(args.data_dir, args.seq_len),
        ctx,
        batch_size=args.batch_size,
        shuffle=True,
        seed=args.seed,
    )

    config = LlamaConfig(
        vocab_size=256,
        hidden_size=args.hidden_size,
        intermediate_size=4 * args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        max_position_embeddings=args.seq_len,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)  # random weights from the config: no download, no hub access
    model = exatrain.parallelize(
        model, ctx
    )  # fully_shard on each LlamaDecoderLayer (found by itself), then the root
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    ckpt = exatrain.Checkpointer(
        args.run_dir, ctx, model=model, optimizer=optimizer, loader=loader, interval=args.checkpoint_interval
    )
    step = ckpt.resume()
    log = exatrain.MetricsLog(Path(args.run_dir) / "metrics.jsonl", resume_step=step)
    model.train()
    while step < args.steps:
        for ids in loader:
            ids = ids.to(ctx.device)
            loss = model(input_ids=ids, labels=ids).loss  # the model shifts the labels itself
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
