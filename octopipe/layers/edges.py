"""The model's edges: token embedding, LM head with cross-entropy, and the vision front end
(patch embedding, ViT block, projector to the text width)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octopipe.layers.attention import Attention
from octopipe.layers.mlp import FeedForward
from octopipe.model.layer import LayerSpec


class Embedding(nn.Module):
    """Token ids → vectors. Vision tokens carried in from a projector are placed in front."""

    def __init__(self, spec: LayerSpec, vocab: int) -> None:
        super().__init__()
        self.table = nn.Embedding(spec.vocab or vocab, spec.hidden)

    def forward(self, x: torch.Tensor | None, batch: dict) -> torch.Tensor:
        h = self.table(batch["ids"])
        return h if x is None else torch.cat([x, h], dim=1)


class Head(nn.Module):
    """Final norm, LM head and mean cross-entropy over the text positions (the last seq_len)."""

    def __init__(self, spec: LayerSpec, vocab: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(spec.hidden)
        self.proj = nn.Linear(spec.hidden, spec.vocab or vocab, bias=False)

    def logits(self, x: torch.Tensor, seq_len: int) -> torch.Tensor:
        return self.proj(self.norm(x[:, -seq_len:]))

    def forward(self, x: torch.Tensor, batch: dict) -> torch.Tensor:
        targets = batch["targets"]
        logits = self.logits(x, targets.shape[1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


class PatchEmbed(nn.Module):
    """Flattened image patches [b, tokens, channels·patch²] → vectors plus learned positions
    (a linear map over a flattened patch equals a stride-`patch` convolution)."""

    def __init__(self, spec: LayerSpec, tokens: int) -> None:
        super().__init__()
        self.proj = nn.Linear(spec.channels * spec.patch * spec.patch, spec.hidden)
        self.pos = nn.Parameter(torch.randn(tokens, spec.hidden) * 0.02)

    def forward(self, x: torch.Tensor | None, batch: dict) -> torch.Tensor:
        return self.proj(batch["pixels"]) + self.pos


class ViTBlock(nn.Module):
    """Pre-norm bidirectional (spec.causal=False) attention followed by a GELU MLP."""

    def __init__(self, spec: LayerSpec) -> None:
        super().__init__()
        self.attn = Attention(spec)
        self.norm = nn.LayerNorm(spec.hidden)
        self.mlp = FeedForward(spec.hidden, spec.ffn, spec.hidden, spec.activation, spec.bias)

    def forward(self, x: torch.Tensor, batch: dict) -> torch.Tensor:
        x = self.attn(x, batch)
        return x + self.mlp(self.norm(x))


class Projector(nn.Module):
    """Merge `in_hidden / vit_hidden` neighbouring patches, then an MLP to the text width."""

    def __init__(self, spec: LayerSpec, in_width: int) -> None:
        super().__init__()
        self.in_hidden = spec.in_hidden or in_width
        if self.in_hidden % in_width:
            raise ValueError(f"projector {spec.label}: in_hidden={self.in_hidden} is not a multiple of "
                             f"the vision width {in_width}")
        self.norm = nn.LayerNorm(in_width)
        self.mlp = FeedForward(self.in_hidden, spec.ffn or spec.hidden, spec.hidden, "gelu", spec.bias)

    def forward(self, x: torch.Tensor, batch: dict) -> torch.Tensor:
        x = self.norm(x)
        return self.mlp(x.reshape(x.shape[0], -1, self.in_hidden))
