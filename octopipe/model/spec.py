"""ModelSpec: an ordered list of layers plus the training shape (sequence, micro-batch)."""
from __future__ import annotations

from dataclasses import dataclass

from octopipe.model.layer import LayerSpec


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: tuple[LayerSpec, ...]
    seq_len: int
    micro_batch_size: int = 1
    vocab: int = 0
    source: str = ""

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def tokens_per_microbatch(self) -> int:
        return self.seq_len * self.micro_batch_size
