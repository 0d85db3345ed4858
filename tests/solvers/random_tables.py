"""Random schedule tables for cross-checks: valid random orders, then random comm swaps."""
from __future__ import annotations

import numpy as np

from octopipe.schedule.action import Action, B, F, I, W
from octopipe.schedule.lower import lower
from octopipe.schedule.table import ScheduleTable
from octopipe.schedule.validate import data_predecessors


def random_compute_table(rng: np.random.Generator, n_devices: int, n_stages: int,
                         n_microbatches: int, split: bool) -> ScheduleTable:
    """A random placement and a random global topological order, cut into device rows."""
    placement = [int(x) for x in rng.integers(0, n_devices, n_stages)]
    for d in range(n_devices):                      # every device holds a stage
        if d not in placement:
            placement[int(rng.integers(0, n_stages))] = d
    if len(set(placement)) < n_devices:
        placement = [s % n_devices for s in range(n_stages)]
    kinds = (F, I, W) if split else (F, B)
    acts = [Action(s, k, m) for s in range(n_stages) for m in range(n_microbatches) for k in kinds]
    splitset = {(s, m) for s in range(n_stages) for m in range(n_microbatches)} if split else set()
    preds = {a: list(data_predecessors(a, n_stages, splitset)) for a in acts}
    done: set[Action] = set()
    rows: list[list[Action]] = [[] for _ in range(n_devices)]
    todo = set(acts)
    while todo:
        ready = sorted((a for a in todo if all(p in done for p in preds[a])), key=str)
        a = ready[int(rng.integers(0, len(ready)))]
        todo.remove(a)
        done.add(a)
        rows[placement[a.stage]].append(a)
    return ScheduleTable.from_rows(rows, placement, n_microbatches, "random")


def swap_comms(rng: np.random.Generator, table: ScheduleTable, n_swaps: int) -> ScheduleTable:
    """Move SEND/RECV cells: swap a comm cell with a neighbour or move it elsewhere in its row."""
    rows = [list(table.actions(d)) for d in range(table.n_devices)]
    for _ in range(n_swaps):
        d = int(rng.integers(0, len(rows)))
        comm = [k for k, a in enumerate(rows[d]) if a.kind.is_comm]
        if not comm:
            continue
        k = comm[int(rng.integers(0, len(comm)))]
        if rng.random() < 0.7:
            j = min(max(k + int(rng.choice([-1, 1])), 0), len(rows[d]) - 1)
            rows[d][k], rows[d][j] = rows[d][j], rows[d][k]
        else:
            a = rows[d].pop(k)
            rows[d].insert(int(rng.integers(0, len(rows[d]) + 1)), a)
    return table.with_rows(rows)


def random_table(rng: np.random.Generator) -> ScheduleTable:
    """A small random table: compute-only or lowered, with 0-4 random comm moves."""
    n_dev = int(rng.integers(2, 5))
    n_stages = n_dev * int(rng.integers(1, 3))
    table = random_compute_table(rng, n_dev, n_stages, int(rng.integers(1, 5)), bool(rng.random() < 0.4))
    if rng.random() < 0.15:
        return table
    return swap_comms(rng, lower(table), int(rng.integers(0, 5)))
