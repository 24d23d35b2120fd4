"""The reference decoder-only Transformer LM, in one readable file (in the spirit of nanoGPT).

Attention keeps separate q/k/v/o projections and views heads with -1 so tensor-parallel plans that
shard the projections column-/row-wise work without changes here. Shapes: B batch, T time, D model
width, H heads, Hd head width, V vocabulary.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from exatrain.models.sizes import ModelShape, model_shape


class Attention(nn.Module):
    """Causal multi-head self-attention via scaled_dot_product_attention."""

    def __init__(self, dim: int, n_heads: int, dropout: float):
        super().__init__()
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # (B, T, D) -> (B, H, T, Hd); -1 picks up the local head count under tensor parallelism
        q = self.wq(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)  # (B, H, T, Hd)
        y = y.transpose(1, 2).reshape(B, T, -1)  # (B, T, D)
        return self.wo(y)


class MLP(nn.Module):
    """Position-wise feed-forward: D -> ratio*D -> D with GELU."""

    def __init__(self, dim: int, hidden: int, dropout: float):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.w2(F.gelu(self.w1(x))))


class Block(nn.Module):
    """Pre-norm Transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, shape: ModelShape, dropout: float):
        super().__init__()
        self.attention_norm = nn.RMSNorm(shape.dim)
        self.attention = Attention(shape.dim, shape.n_heads, dropout)
        self.ffn_norm = nn.RMSNorm(shape.dim)
        self.ffn = MLP(shape.dim, shape.mlp_ratio * shape.dim, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class TransformerLM(nn.Module):
    """Token + learned position embeddings, a stack of blocks, a final norm and an output head."""

    def __init__(self, shape: ModelShape, vocab_size: int, max_seq_len: int, dropout: float = 0.0):
        super().__init__()
        if shape.dim % shape.n_heads:
            raise ValueError(f"dim {shape.dim} is not divisible by n_heads {shape.n_heads}")
        self.shape, self.vocab_size, self.max_seq_len = shape, vocab_size, max_seq_len
        self.tok_embeddings = nn.Embedding(vocab_size, shape.dim)
        self.pos_embeddings = nn.Embedding(max_seq_len, shape.dim)
        self.drop = nn.Dropout(dropout)
        # a dict keyed by layer index keeps names stable when pipeline stages drop layers later
        self.layers = nn.ModuleDict({str(i): Block(shape, dropout) for i in range(shape.n_layers)})
        self.norm = nn.RMSNorm(shape.dim)
        self.output = nn.Linear(shape.dim, vocab_size, bias=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """GPT-2 style init; residual output projections scaled by 1/sqrt(2 * layers)."""
        if seed is not None:
            torch.manual_seed(seed)
        residual_std = 0.02 / math.sqrt(2 * self.shape.n_layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)  # RMSNorm weights
            elif name.endswith(("wo.weight", "w2.weight")):
                nn.init.normal_(p, std=residual_std)
            else:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V) for tokens (B, T); with targets (B, T), the mean cross-entropy instead.

        A pipeline stage chunk (models.pipeline_split) lacks some parts: without embeddings its input
        is the previous stage's hidden states (B, T, D); without the output head it returns hidden states.
        """
        if self.tok_embeddings is None:
            h = tokens  # (B, T, D) from the previous pipeline stage
        else:
            pos = torch.arange(tokens.shape[1], device=tokens.device)
            h = self.drop(self.tok_embeddings(tokens) + self.pos_embeddings(pos))  # (B, T, D)
        for layer in self.layers.values():
            h = layer(h)
        if self.output is None:
            return h
        logits = self.output(self.norm(h))  # (B, T, V)
        return logits if targets is None else lm_loss(logits, targets)

    def num_params(self, embeddings: bool = True) -> int:
        """Parameter count, optionally without the embedding tables."""
        n = sum(p.numel() for p in self.parameters())
        if not embeddings and self.tok_embeddings is not None:
            n -= self.tok_embeddings.weight.numel() + self.pos_embeddings.weight.numel()
        return n


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of logits (B, T, V) against targets (B, T), computed in fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def build_model(
    size: str, vocab_size: int, max_seq_len: int, dropout: float = 0.0, n_layers: int = 0
) -> TransformerLM:
    """The reference model of a named size (optionally another depth) for a vocabulary and context length."""
    return TransformerLM(model_shape(size, n_layers), vocab_size, max_seq_len, dropout)
