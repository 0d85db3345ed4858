"""Staleness of an asynchronous stream, counted as Ilin & Richtárik count it.

The stages' block updates are numbered k = 0, 1, ... in time order (unit ticks, stages in
order within a tick). A forward of micro-batch mb at stage j reads block j at history index h
(the number of updates applied anywhere when the version it reads was last current); the
update k that micro-batch feeds then has delay d_j = k - h on block j. The steady-state
maximum of d over blocks is PD's delta, which grows as S^2 - S/2 + O(1).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from octopipe.asynchronous.tables import AsyncSchedule, Rule, async_schedule
from octopipe.report.figures import pyplot, save
from octopipe.schedule.action import F


@dataclass(frozen=True)
class Delays:
    """Per update k (rows, time order): the stage it updates, the micro-batch, and the read
    delay of every block (`delays[k, j]`); several rows share k under 2BW (one per
    micro-batch of the window)."""

    update: np.ndarray      # [n] global update index
    stage: np.ndarray       # [n] stage updated
    microbatch: np.ndarray  # [n]
    delays: np.ndarray      # [n, S]

    def steady(self) -> Delays:
        """The rows of the second half of the updates (the steady state of a long stream)."""
        keep = self.update >= (int(self.update.max()) + 1) // 2
        return Delays(self.update[keep], self.stage[keep], self.microbatch[keep], self.delays[keep])


@dataclass(frozen=True)
class DelayStats:
    """Mean and max delay of each block's reads and over all blocks."""

    mean_by_stage: tuple[float, ...]
    max_by_stage: tuple[int, ...]
    mean: float
    max: int


def read_delays(sched: AsyncSchedule) -> Delays:
    """The delay of every block read behind every update of `sched`."""
    n_stages = sched.n_stages
    order: list[tuple[int, int]] = []        # (stage, update index) in global time order
    g: dict[tuple[int, int], int] = {}       # (stage, update index) -> global index
    h_forward: dict[tuple[int, int], int] = {}
    version: dict[tuple[int, int], int] = {}
    backs: list[tuple[int, int, int]] = []   # (stage, microbatch, update index of its stage)
    pending: dict[int, list[int]] = {s: [] for s in range(n_stages)}
    for e in sched.events:
        a = e.action
        if a.kind is F:
            h_forward[(a.stage, a.microbatch)] = len(order)
            version[(a.stage, a.microbatch)] = e.version
            continue
        if e.action.kind.value in ("B", "W"):
            pending[a.stage].append(a.microbatch)
        if e.update >= 0:
            g[(a.stage, e.update)] = len(order)
            order.append((a.stage, e.update))
            backs += [(a.stage, mb, e.update) for mb in pending[a.stage]]
            pending[a.stage] = []
    n = len(backs)
    upd = np.empty(n, dtype=np.int64)
    stg = np.empty(n, dtype=np.int64)
    mbs = np.empty(n, dtype=np.int64)
    d = np.empty((n, n_stages), dtype=np.int64)
    big = len(order) + 1
    for row, (s, mb, u) in enumerate(backs):
        k = g[(s, u)]
        upd[row], stg[row], mbs[row] = k, s, mb
        for j in range(n_stages):
            h = min(h_forward[(j, mb)], g.get((j, version[(j, mb)]), big))
            d[row, j] = k - h
    return Delays(upd, stg, mbs, d)


def delay_stats(delays: Delays) -> DelayStats:
    x = delays.delays
    return DelayStats(tuple(float(v) for v in x.mean(axis=0)), tuple(int(v) for v in x.max(axis=0)),
                      float(x.mean()), int(x.max()))


def delay_law(n_stages: int) -> float:
    """The paper's steady-state PD delay without its O(1): S^2 - S/2."""
    return n_stages ** 2 - n_stages / 2


def delay_by_stages(stages: tuple[int, ...], per_stage: int = 10,
                    rule: Rule | str = Rule.PD) -> dict[int, DelayStats]:
    """Steady-state delay statistics for each S, on a stream of `per_stage`·S micro-batches."""
    return {s: delay_stats(read_delays(async_schedule(rule, s, per_stage * s)).steady())
            for s in stages}


def law_residuals(stats: dict[int, DelayStats]) -> dict[int, float]:
    """max delay - (S^2 - S/2) per S: bounded by a constant if the law holds."""
    return {s: float(st.max - delay_law(s)) for s, st in stats.items()}


def plot_delay_law(stats: dict[int, DelayStats], path: Path) -> None:
    """Mean and max steady-state delay against S, with S^2 - S/2 drawn over them (log-log)."""
    plt = pyplot()

    s = np.array(sorted(stats))
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.plot(s, [stats[x].max for x in s], "o", label="max delay (measured)")
    ax.plot(s, [stats[x].mean for x in s], "s", label="mean delay (measured)")
    grid = np.linspace(s.min(), s.max(), 200)
    ax.plot(grid, grid ** 2 - grid / 2, "-", label="S² − S/2")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("stages S")
    ax.set_ylabel("steady-state delay (block updates)")
    ax.legend()
    ax.set_title("PipeDream staleness")
    save(fig, path, dpi=120)


__all__ = ["DelayStats", "Delays", "delay_by_stages", "delay_law", "delay_stats", "law_residuals",
           "plot_delay_law", "read_delays"]
