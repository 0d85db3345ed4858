"""Factories of models whose blocks share parameters, for the shared-parameter tests: a GPT whose
output layer reuses the token embedding (and its untied twin with equal initial weights), a
block applied twice, and a LayerNorm shared by the first block and the head."""
from __future__ import annotations

import sys
from pathlib import Path

from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from tiny_gpt import Block, build

WIDTH, HEADS = 32, 2


def _gpt(vocab: int, depth: int = 2) -> nn.Sequential:
    return build(vocab=vocab, width=WIDTH, depth=depth, heads=HEADS, max_seq=64)


def tied(vocab: int = 256, untie: bool = False) -> nn.Sequential:
    """Embedding, 2 blocks, head; the head's projection is the embedding matrix (`untie`: a copy
    of it, so that both start from equal weights)."""
    gpt = _gpt(vocab)
    emb = gpt[0].tok.weight
    gpt[-1].proj.weight = nn.Parameter(emb.detach().clone()) if untie else emb
    return gpt


def repeated(vocab: int = 256) -> nn.Sequential:
    """Embedding, block A, block A again (the same module), block B, head."""
    gpt = _gpt(vocab)
    return nn.Sequential(gpt[0], gpt[1], gpt[1], gpt[2], gpt[3])


def shared_norm(vocab: int = 256) -> list[nn.Module]:
    """Embedding, 3 blocks, head; the first block's first norm is the head's norm."""
    gpt = _gpt(vocab, depth=3)
    gpt[1].norm1 = gpt[-1].norm
    return list(gpt)


__all__ = ["Block", "repeated", "shared_norm", "tied"]
