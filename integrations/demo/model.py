"""A small GPT-style language model and a synthetic data stream for the demo and tests."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(x).split(hidden, dim=-1)
        shape = (batch, seq, self.heads, hidden // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, seq, hidden))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = CausalSelfAttention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Decoder-only transformer: embeddings, ``layers`` pre-LN blocks, tied LM head."""

    def __init__(self, vocab: int = 512, hidden: int = 128, layers: int = 4, heads: int = 4,
                 seq_len: int = 64) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Parameter(torch.zeros(seq_len, hidden))
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        nn.init.normal_(self.tokens.weight, std=1 / math.sqrt(hidden))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tokens(tokens) + self.positions[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.tokens.weight.t()


def synthetic_batches(vocab: int, seq_len: int, batch: int, seed: int):
    """An endless stream of (input, target) batches of a learnable pattern (shifted ranges)."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, vocab, (batch, 1), generator=generator)
        steps = torch.randint(1, 4, (batch, 1), generator=generator)
        sequence = (starts + steps * torch.arange(seq_len + 1)) % vocab
        yield sequence[:, :-1], sequence[:, 1:]

