"""Tensor parallelism inside a stage: the pp x tp grid, its checks and RRFP's agreement.

World rank r is TP rank `r % tp` of pipeline rank `r // tp`; the TP ranks of one pipeline rank
form its TP group. Within a stage the layers are the Megatron variants of
`octopipe.layers.tensor_parallel`. Under ready-first dispatch the TP ranks of a stage must issue
identical collectives in identical order, so before a task with TP collectives they `agree`: an
all-gather of one scalar (the task each would pick, -1 for none); the task runs only if every
rank picked it, otherwise it is deferred and each picks again (see runtime/README.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from octopipe.errors import ConfigError
from octopipe.layers.tensor_parallel import tp_problem
from octopipe.model.spec import ModelSpec

NONE = -1


@dataclass(frozen=True)
class Grid:
    """`pp` pipeline ranks, each `tp` TP ranks wide."""

    pp: int
    tp: int

    @property
    def world(self) -> int:
        return self.pp * self.tp

    def coords(self, rank: int) -> tuple[int, int]:
        """(pipeline rank, TP rank) of a world rank."""
        return rank // self.tp, rank % self.tp

    def rank(self, pipeline_rank: int, tp_rank: int) -> int:
        return pipeline_rank * self.tp + tp_rank

    def tp_groups(self) -> list:
        """One process group per pipeline rank over its TP ranks (every rank creates every
        group, in the same order, as torch requires)."""
        return [dist.new_group([self.rank(p, t) for t in range(self.tp)]) for p in range(self.pp)]


def check_grid(model: ModelSpec | None, tp: int, pp: int, ranks: int | None = None) -> Grid:
    """The grid, or a ConfigError naming the field: tp out of range, a tp that does not divide a
    layer's heads / FFN width / experts / vocabulary, or more ranks than there are."""
    if tp < 1 or tp > 64:
        raise ConfigError(f"runtime.tp={tp} must lie in [1, 64]")
    if ranks is not None and tp * pp > ranks:
        raise ConfigError(f"runtime.tp={tp} x pp={pp} = {tp * pp} ranks, more than the {ranks} "
                          "available; lower tp or pp")
    if model is not None and tp > 1:
        if model.layers and model.layers[0].hidden % tp:
            raise ConfigError(f"runtime.tp={tp} does not divide the hidden size "
                              f"{model.layers[0].hidden}; choose a divisor")
        for spec in model.layers:
            problem = tp_problem(spec, tp, model.vocab)
            if problem is not None:
                raise ConfigError(f"runtime.{problem}; choose a tp that divides it")
    return Grid(pp, tp)


def agree(pick: int, group) -> bool:
    """Whether every rank of `group` picked the same task `pick` (an all-gather of one scalar);
    `NONE` (no ready task) never agrees."""
    n = dist.get_world_size(group)
    mine = torch.tensor([pick], dtype=torch.int64)
    picks = [torch.empty(1, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(picks, mine, group=group)
    return pick != NONE and all(int(p) == pick for p in picks)
