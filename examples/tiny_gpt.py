"""A complete model factory for `model=module`: a small GPT as a list of pipeline blocks.

    python -m octopipe.run mode=train model=module model.factory=examples/tiny_gpt.py:build

The contract (octopipe/model/user_module.py): the factory returns an nn.Sequential or a list of
modules; the first takes int64 token ids [batch, seq], the last returns logits
[batch, seq, vocab]; every element is a block the planner may cut after. This module could
also export `loss_fn(logits, targets) -> scalar`; without one the loss is next-token
cross-entropy.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Embed(nn.Module):
    """Token and learned position embeddings."""

    def __init__(self, vocab: int, width: int, max_seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.randn(max_seq, width) * 0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tok(ids) + self.pos[: ids.shape[1]]


class Block(nn.Module):
    """Pre-norm causal self-attention, then a GELU MLP, each with a residual."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)   # a key bias has no gradient but noise
        self.out = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, w // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, w))
        return x + self.mlp(self.norm2(x))


class Head(nn.Module):
    """Final norm and the projection to the vocabulary."""

    def __init__(self, width: int, vocab: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


def build(vocab: int = 256, width: int = 128, depth: int = 4, heads: int = 4,
          max_seq: int = 256) -> nn.Sequential:
    """Embedding, `depth` transformer blocks, head: depth + 2 blocks for the planner."""
    return nn.Sequential(Embed(vocab, width, max_seq), *(Block(width, heads) for _ in range(depth)),
                         Head(width, vocab))
