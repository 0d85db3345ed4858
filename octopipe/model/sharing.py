"""Tensors that several blocks of a user's model hold: found by identity in the factory's own
modules (a tied embedding and output layer, a block applied twice, a norm shared across the
model), and the model's own names for every parameter.

The names are those `nn.Sequential(*blocks)` gives: `<block index>.<name inside the block>`,
the first holder's name for a shared tensor (as `named_parameters` deduplicates), so a state
dict keyed by them loads into the user's own module.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class Tied:
    """One tensor held by more than one block: `holders` are (block index, name inside the
    block) in model order, the first giving its `name`; `parameter` False for a buffer."""

    name: str
    holders: tuple[tuple[int, str], ...]
    parameter: bool
    shape: tuple[int, ...]
    numel: int

    @property
    def blocks(self) -> tuple[int, ...]:
        return tuple(sorted({j for j, _ in self.holders}))


def _holders(blocks: Sequence[nn.Module], parameters: bool) -> dict[int, list[tuple[int, str]]]:
    found: dict[int, list[tuple[int, str]]] = {}
    for j, block in enumerate(blocks):
        named = block.named_parameters(remove_duplicate=False) if parameters else \
            block.named_buffers(remove_duplicate=False)
        for n, t in named:
            found.setdefault(id(t), []).append((j, n))
    return found


def tied_tensors(blocks: Sequence[nn.Module]) -> tuple[Tied, ...]:
    """Every parameter and buffer more than one block holds, in model order."""
    out = []
    for parameters in (True, False):
        tensors = {id(t): t for b in blocks for t in (b.parameters() if parameters else b.buffers())}
        for key, holders in _holders(blocks, parameters).items():
            if len({j for j, _ in holders}) > 1:
                t = tensors[key]
                out.append(Tied(f"{holders[0][0]}.{holders[0][1]}", tuple(holders), parameters, tuple(t.shape),
                                t.numel()))
    return tuple(sorted(out, key=lambda t: t.holders[0]))


def canonical_names(blocks: Sequence[nn.Module]) -> dict[tuple[int, str], str]:
    """(block index, parameter name inside the block) -> the model's name for that parameter."""
    out = {}
    for holders in _holders(blocks, True).values():
        for h in holders:
            out[h] = f"{holders[0][0]}.{holders[0][1]}"
    return out


def unique_parameters(blocks: Sequence[nn.Module]) -> int:
    """The model's parameter count, a shared parameter counted once."""
    return sum(p.numel() for p in nn.ModuleList(blocks).parameters())
