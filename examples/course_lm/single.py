"""Train a small Transformer language model on WikiText-2, on one CPU or GPU.

The JSC course exercise before it is distributed: a plain PyTorch script. `distributed.py` next to it
is the same script with exatrain (compare them with `diff single.py distributed.py`).

    python single.py --data-dir /path/to/wikitext-2 --epochs 3
"""

import argparse
import math
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset


def parse_args(argv=None):
    """The command line: data, sizes, training length."""
    parser = argparse.ArgumentParser(description="Transformer language model on WikiText-2")
    parser.add_argument("--data-dir", default="wikitext-2",
                        help="directory with train.txt, valid.txt, test.txt (or wiki.*.tokens)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per training step")
    parser.add_argument("--test-batch-size", type=int, default=32, help="sequences per evaluation step")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--n-heads", type=int, default=4)
    parser.add_argument("--n-layers", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--no-shuffle", dest="shuffle", action="store_false", help="train on the sequences in order")
    parser.add_argument("--out-dir", default="out", help="where model-best.pt and model-final.pt go")
    return parser.parse_args(argv)


# ---------------------------------------------------------------- data: word-level WikiText-2

def split_file(data_dir, split):
    """wiki.train.tokens (the original name) or train.txt."""
    for name in (f"wiki.{split}.tokens", f"{split}.txt"):
        if (Path(data_dir) / name).is_file():
            return Path(data_dir) / name
    raise FileNotFoundError(f"no {split} split in {data_dir}")


def read_words(path):
    """All words of a split file, with <eos> at the end of each line (word-level language modelling)."""
    words = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            words += line.split() + ["<eos>"]
    return words


class Vocabulary:
    """Every word of the training split gets an id; unseen words become <unk>."""

    def __init__(self, words):
        self.itos = ["<unk>"] + sorted(set(words) - {"<unk>"})
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    def encode(self, words):
        return torch.tensor([self.stoi.get(w, 0) for w in words], dtype=torch.long)


class Sequences(Dataset):
    """Consecutive windows of seq_len tokens; the target is the window shifted by one token."""

    def __init__(self, ids, seq_len):
        self.ids, self.seq_len = ids, seq_len

    def __len__(self):
        return (len(self.ids) - 1) // self.seq_len

    def __getitem__(self, i):
        chunk = self.ids[i * self.seq_len: (i + 1) * self.seq_len + 1]
        return chunk[:-1], chunk[1:]


def load_split(data_dir, split, vocab, seq_len):
    """One split as a dataset of sequences, encoded with the training vocabulary."""
    return Sequences(vocab.encode(read_words(split_file(data_dir, split))), seq_len)


# ---------------------------------------------------------------- model

class TransformerLM(nn.Module):
    """Token and position embeddings, causal Transformer encoder layers, a linear head over the vocabulary."""

    def __init__(self, vocab_size, d_model, n_heads, n_layers, seq_len, dropout):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, n_heads, 4 * d_model, dropout, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, x):
        t = x.size(1)
        h = self.embed(x) + self.pos(torch.arange(t, device=x.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=x.device)
        h = self.encoder(h, mask=mask, is_causal=True)
        return self.head(self.norm(h))


# ---------------------------------------------------------------- training

def train_epoch(model, loader, optimizer, device):
    """One pass over the training data; the mean training loss."""
    model.train()
    total = 0.0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item()
    result = total / len(loader)
    return result


@torch.no_grad()
def evaluate(model, loader, device):
    """The mean loss on a validation or test loader."""
    model.eval()
    total = 0.0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        logits = model(x)
        total += F.cross_entropy(logits.flatten(0, 1), y.flatten()).item()
    result = total / len(loader)
    return result


def main(argv=None):
    """Train for --epochs, keep the best model by validation loss, test the final one."""
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    vocab = Vocabulary(read_words(split_file(args.data_dir, "train")))
    train_data, valid_data, test_data = (load_split(args.data_dir, split, vocab, args.seq_len)
                                         for split in ("train", "valid", "test"))
    train_loader = torch.utils.data.DataLoader(train_data, batch_size=args.batch_size, shuffle=args.shuffle, drop_last=True)
    valid_loader = torch.utils.data.DataLoader(valid_data, batch_size=args.test_batch_size, drop_last=True)
    test_loader = torch.utils.data.DataLoader(test_data, batch_size=args.test_batch_size, drop_last=True)

    model = TransformerLM(len(vocab.itos), args.d_model, args.n_heads, args.n_layers, args.seq_len, args.dropout)
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    history = {"train": [], "valid": []}
    best = math.inf
    for epoch in range(args.epochs):
        train_loss = train_epoch(model, train_loader, optimizer, device)
        valid_loss = evaluate(model, valid_loader, device)
        history["train"].append(train_loss)
        history["valid"].append(valid_loss)
        print(f"[{epoch + 1}/{args.epochs}] train loss {train_loss:.5f}, valid loss {valid_loss:.5f}, "
              f"valid perplexity {math.exp(valid_loss):.2f}")
        if valid_loss < best:
            best = valid_loss
            torch.save({"model": model.state_dict(), "history": history}, out / "model-best.pt")

    history["test"] = evaluate(model, test_loader, device)
    print(f"test loss {history['test']:.5f}, test perplexity {math.exp(history['test']):.2f}")
    torch.save({"model": model.state_dict(), "history": history}, out / "model-final.pt")


if __name__ == "__main__":
    main()
