"""The model's own parameter names on the ranks, and shared parameters kept one parameter.

A stage names its parameters `layers.<block>.<...>`; the model (the user's factory output)
names them `<block>.<...>`, a shared one by its first holder (`octopipe.model.sharing`).
Checkpoints, final weights and the reference comparison use the model's names, so they do not
depend on the plan. A parameter several stages hold (a tied embedding and output layer) has a
copy in each; after every backward `TiedGrads.sum` adds the copies' gradients over the ranks
that hold them, so every copy takes the same AdamW step from the whole gradient, and the
global norm counts it once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from octopipe.errors import ConfigError
from octopipe.model.sharing import Tied, canonical_names, tied_tensors
from octopipe.model.user_module import UserBlocks
from octopipe.runtime.stage import StageModule, as_blocks


def _inner(stage_name: str) -> tuple[int, str] | None:
    """(block, name inside the user's block) of a stage parameter name `layers.<j>.inner.<n>`."""
    head, _, rest = stage_name.partition(".")
    j, _, rest = rest.partition(".")
    inner, _, n = rest.partition(".")
    return (int(j), n) if head == "layers" and inner == "inner" and j.isdigit() else None


@dataclass(frozen=True)
class ModelNames:
    """Stage parameter name -> the model's name (identity for a preset's layers)."""

    canonical: dict[tuple[int, str], str]

    @classmethod
    def of(cls, blocks, seed: int) -> ModelNames:
        if isinstance(blocks, UserBlocks):
            return cls(canonical_names(blocks.raw(seed)[0]))
        return cls({})

    def __call__(self, stage_name: str) -> str:
        key = _inner(stage_name) if self.canonical else None
        return self.canonical.get(key, stage_name) if key is not None else stage_name


def model_shapes(blocks, seed: int) -> dict[str, tuple[int, ...]]:
    """The model's name -> shape of every parameter (a shared one once)."""
    if isinstance(blocks, UserBlocks):
        raw = blocks.raw(seed)[0]
        return {n: tuple(p.shape) for n, p in nn.Sequential(*raw).named_parameters()}
    return {n: tuple(p.shape) for n, p in StageModule(blocks, 0, as_blocks(blocks).n_blocks, seed).named_parameters()}


def cross_stage_ties(blocks, seed: int, partition) -> list[tuple[Tied, tuple[int, ...]]]:
    """The shared parameters whose holders lie in more than one stage, with those stages."""
    if not isinstance(blocks, UserBlocks):
        return []
    stage_of = {j: s for s, (lo, hi) in enumerate(partition) for j in range(lo, hi)}
    out = []
    for t in tied_tensors(blocks.raw(seed)[0]):
        stages = tuple(sorted({stage_of[j] for j in t.blocks}))
        if t.parameter and len(stages) > 1:
            out.append((t, stages))
    return out


@dataclass
class _Entry:
    tie: Tied
    stages: tuple[int, ...]
    copies: list[nn.Parameter]          # this rank's copies of the parameter
    adding: list[nn.Parameter]          # the copies whose gradient this rank adds (one per stage)
    ranks: tuple[int, ...]
    group: object


class TiedGrads:
    """A rank's copies of every parameter held by several stages, and a process group per
    parameter over the ranks holding it (created collectively, on every rank in one order)."""

    def __init__(self, blocks, seed: int, partition, table, rank: int, copies: dict, grid=None) -> None:
        """`rank`: this process's world rank; `grid` (runtime.tensor_parallel.Grid; None: one
        rank per pipeline rank) maps pipeline ranks to world ranks: the copies of a data-parallel
        replica (TP rank) are summed within it, a group per replica."""
        here = grid.place(rank) if grid is not None else (rank, 0, 0)
        world = (lambda d: grid.rank(d, here[2], here[1])) if grid is not None else (lambda d: d)
        holders = {}       # stage -> (device, replica) of the copy whose gradient counts
        for d in range(table.n_devices):
            for r, s in table.replica_stages_of(d):
                holders[s] = min(holders.get(s, (d, r)), (d, r))
        self.entries: list[_Entry] = []
        self.uncounted: set[int] = set()
        rank = here[0]
        for tie, stages in cross_stage_ties(blocks, seed, partition):
            devices = sorted({d for d in range(table.n_devices) for _, s in table.replica_stages_of(d) if s in stages})
            ranks = tuple(world(d) for d in devices)
            group = None
            if len(ranks) > 1:      # every process creates every replica's group, in one order
                every = [(k, t) for k in range(grid.dp if grid else 1) for t in range(grid.tp if grid else 1)]
                made = {(k, t): dist.new_group([grid.rank(d, t, k) if grid else d for d in devices])
                        for k, t in every}
                group = made[(here[1], here[2])]
            mine, adding = [], []
            for (r, s), mod in sorted(copies.items()):
                if s not in stages:
                    continue
                j, n = next(h for h in tie.holders if partition[s][0] <= h[0] < partition[s][1])
                p = mod.layers[str(j)].inner.get_parameter(n)
                mine.append(p)
                if holders[s] == (rank, r):
                    adding.append(p)
                if r == 0 and s != stages[0]:
                    self.uncounted.add(id(p))
            self.entries.append(_Entry(tie, stages, mine, adding, ranks, group))

    def check_equal(self, rank: int) -> None:
        """Collective: every copy equals the first stage's (a factory that ignores the seed
        builds different weights on each rank); ConfigError naming the parameter otherwise."""
        for e in self.entries:
            if not e.copies:
                continue
            ref = e.copies[0].detach().clone()
            if e.group is not None:
                dist.broadcast(ref, src=e.ranks[0], group=e.group)
            if any(not torch.equal(p.detach(), ref) for p in e.copies):
                raise ConfigError(f"model.factory: the shared parameter {e.tie.name} (blocks {list(e.tie.blocks)}) "
                                  f"has different values on different ranks; build the model from "
                                  f"torch's generator, which the factory's seed sets")

    def sum(self) -> None:
        """Collective: each copy's gradient becomes the sum over the stages holding it."""
        for e in self.entries:
            if not e.copies:
                continue
            total = torch.zeros_like(e.copies[0])
            for p in e.adding:
                if p.grad is not None:
                    total += p.grad
            if e.group is not None:
                dist.all_reduce(total, group=e.group)
            for p in e.copies:
                p.grad = total.clone()

    def replicas_equal(self) -> bool:
        """Whether this rank's copies of each shared parameter are equal to the bit."""
        return all(torch.equal(e.copies[0], p) for e in self.entries for p in e.copies[1:])
