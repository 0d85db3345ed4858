"""The two clocks the optimizers run on: unit ticks (each F or B one tick, as the paper's study)
and the communication-aware simulator's seconds on a chosen model and cluster."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from octopipe.cluster import Cluster
from octopipe.cost.table import CostTable
from octopipe.plan import uniform_partition
from octopipe.schedule.action import Action
from octopipe.schedule.table import ScheduleTable
from octopipe.sim import Simulator


@dataclass(frozen=True)
class Clock:
    """End time of every compute action of one table, in ticks and in simulated seconds
    (seconds are 0 when no cost model is given)."""

    ticks: dict[Action, int]
    seconds: dict[Action, float]
    span_ticks: int
    span_seconds: float


@dataclass(frozen=True)
class Machine:
    """The costs and cluster the seconds clock simulates on (layers split evenly per table)."""

    costs: CostTable
    cluster: Cluster


def clock_of(rows: Sequence[Sequence[Action | None]], n_microbatches: int,
             machine: Machine | None = None, name: str = "clock") -> Clock:
    """Ticks from the time-aligned `rows` (an action ends at its column + 1); seconds from a
    strict-order simulation of the same device orders."""
    ticks = {a: t + 1 for r in rows for t, a in enumerate(r) if a is not None}
    span = max(ticks.values())
    if machine is None:
        return Clock(ticks, dict.fromkeys(ticks, 0.0), span, 0.0)
    table = ScheduleTable(tuple(tuple(a for a in r if a is not None) for r in rows),
                          tuple(range(len(rows))), n_microbatches, name)
    partition = uniform_partition(machine.costs.n_layers, table.n_stages)
    res = Simulator(table, machine.costs, machine.cluster, partition).run()
    prog = res.program
    seconds = {prog.action(c): float(res.end[c]) for c in range(prog.n_compute)}
    return Clock(ticks, seconds, span, float(res.makespan))


__all__ = ["Clock", "Machine", "clock_of"]
