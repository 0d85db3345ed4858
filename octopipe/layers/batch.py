"""The synthetic micro-batch data every rank (and the profiler) rebuilds from a seed."""
from __future__ import annotations

import torch

from octopipe.model.layer import LayerKind
from octopipe.model.spec import ModelSpec


def microbatch(model: ModelSpec, seed: int, iteration: int, mb: int) -> dict:
    """Token ids, next-token targets and (for vision models) image patches of one micro-batch."""
    g = torch.Generator().manual_seed(((seed * 7919 + iteration) * 104_729 + mb) & 0x7FFF_FFFF)
    b, s = model.micro_batch_size, model.seq_len
    vocab = model.vocab or next((l.vocab for l in model.layers if l.vocab), 0)
    tokens = torch.randint(0, vocab, (b, s + 1), generator=g)
    out = {"ids": tokens[:, :-1], "targets": tokens[:, 1:]}
    for spec in model.layers:
        if spec.kind is LayerKind.PATCH_EMBED:
            n = spec.tokens or s
            out["pixels"] = torch.randn(b, n, spec.channels * spec.patch * spec.patch, generator=g)
            break
    return out
