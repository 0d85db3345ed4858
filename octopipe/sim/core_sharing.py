"""Ranks sharing a CPU's cores: when more ranks (plus other work on the machine) compute at once
than there are cores, every running action slows down.

Model (processor sharing): an action during which `k` ranks of its core group compute on average
(itself included), on a group of `cores` cores with `background` cores' worth of other load, lasts
`base * max(1, (k + background) / cores)`. Unpinned ranks form one group over all the machine's
cores. Pinned ranks (`octopipe.runtime.pinning.pin_map`: rank r on core r mod cores) form one
group per core, of one core: 4 ranks on 2 cores then share pairwise, ranks 0 and 2 on one core
and 1 and 3 on the other, and an idle rank gives its core to its partner only. The simulator times actions with fixed
durations, so `makespan` finds the fixed point from outside: simulate, measure each action's
concurrency in its group in the simulated timeline, stretch its duration, simulate again
(damped, a few rounds).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from octopipe.sim import Simulator
from octopipe.sim.sim_result import SimResult


def concurrency(start: np.ndarray, end: np.ndarray, group: np.ndarray | None = None) -> np.ndarray:
    """For each interval, the mean number of intervals (itself included) running during it; with
    `group`, only intervals of its own group count."""
    start, end = np.asarray(start, dtype=np.float64), np.asarray(end, dtype=np.float64)
    overlap = np.clip(np.minimum(end[:, None], end[None, :]) - np.maximum(start[:, None], start[None, :]),
                      0.0, None)
    if group is not None:
        group = np.asarray(group)
        overlap = np.where(group[:, None] == group[None, :], overlap, 0.0)
    length = end - start
    return np.divide(overlap.sum(axis=1), length, out=np.ones(len(start)), where=length > 0)


def stretch(k: np.ndarray, cores: float, background: float) -> np.ndarray:
    """How much longer an action takes when `k` ranks compute at once (see the module docstring)."""
    return np.maximum(1.0, (np.asarray(k, dtype=np.float64) + background) / cores)


def fit_background(groups: np.ndarray, k: np.ndarray, seconds: np.ndarray, cores: float,
                   grid: np.ndarray | None = None) -> float:
    """The background load that best explains how durations of alike actions (same `groups` id)
    vary with their concurrency `k`: least squares in log time, each group at its own base."""
    grid = np.arange(0.0, 4.01, 0.125) if grid is None else grid
    logd = np.log(np.maximum(seconds, 1e-9))
    best, best_err = 0.0, np.inf
    for bg in grid:
        r = logd - np.log(stretch(k, cores, bg))
        err = 0.0
        for g in np.unique(groups):
            sel = r[groups == g]
            err += float(np.sum((sel - np.median(sel)) ** 2))
        if err < best_err - 1e-12:
            best, best_err = float(bg), err
    return best


def makespan(plan, costs, cluster, dispatch: str, cores: float, background: float,
             rounds: int = 8, pinned: Sequence[int] | None = None) -> float:
    """The simulated iteration time of `plan` when ranks share `cores` (see the module docstring);
    with `pinned` (each rank's core), ranks share only the core they are pinned to."""
    return float(shared_run(plan, costs, cluster, dispatch, cores, background, rounds, pinned).makespan)


def shared_run(plan, costs, cluster, dispatch: str, cores: float, background: float,
               rounds: int = 8, pinned: Sequence[int] | None = None) -> SimResult:
    """The simulated run of `plan` at the fixed point `makespan` finds (its timeline and memory)."""
    sim = Simulator(plan, costs, cluster)
    base = sim.durations.compute
    dur = base.copy()
    res = sim.run(sim.durations.scaled(compute=dur), policy=dispatch, semantics="eager")
    group, per_group = None, cores
    if pinned is not None:
        device = np.zeros(len(base), dtype=int)
        for d, ids in enumerate(res.order):
            device[np.asarray(ids, dtype=int)] = d
        group, per_group = np.asarray(pinned)[device], 1.0
    for _ in range(rounds):
        target = base * stretch(concurrency(res.start, res.end, group), per_group, background)
        dur = 0.5 * dur + 0.5 * target
        res = sim.run(sim.durations.scaled(compute=dur), policy=dispatch, semantics="eager")
    return res
