"""Greedy balancer: one pass over the layers, cutting where each stage reaches its share.

Each device gets a share of the work proportional to its speed (the inverse of the model's
total work on its kind), split evenly over the stages it holds; a stage ends at the layer that
brings the running fraction closest to the stage's cumulative share. It ignores transfers and
memory (its result reports whether memory fits): the baseline the exact methods must beat.
"""
from __future__ import annotations

import time

import numpy as np

from octopipe.errors import ConfigError
from solvers.instance import PartitionInstance, partition_from_bounds
from solvers.partition_result import PartitionResult, make_result


def greedy_partition(inst: PartitionInstance) -> PartitionResult:
    if not inst.placement:
        raise ConfigError("greedy_partition needs a fixed placement")
    t0 = time.perf_counter()
    L, S, placement = inst.n_layers, inst.n_stages, inst.placement
    total = np.array([inst.work_ps[-1, inst.col[d]] for d in placement])
    counts = np.bincount(np.asarray(placement), minlength=inst.n_devices)
    speed = np.array([1.0 / max(total[s], 1e-30) / counts[d] for s, d in enumerate(placement)])
    share = np.cumsum(speed / speed.sum())
    bounds, lo = [], 0
    for s in range(S - 1):
        c = inst.col[placement[s]]
        done = inst.work_ps[:, c] / max(inst.work_ps[-1, c], 1e-30)
        # work fraction completed so far, measured on this stage's kind, so hetero devices compare
        prev_frac = share[s - 1] if s else 0.0
        target = done[lo] + (share[s] - prev_frac)
        hi_min, hi_max = lo + 1, L - (S - 1 - s)
        cand = np.arange(hi_min, hi_max + 1)
        hi = int(cand[np.argmin(np.abs(done[cand] - target))])
        bounds.append(hi)
        lo = hi
    part = partition_from_bounds(bounds, L)
    return make_result(inst, part, placement, "greedy", time.perf_counter() - t0, False)


def improve_by_shifts(inst: PartitionInstance, result: PartitionResult,
                      max_rounds: int = 10_000) -> PartitionResult:
    """Local search: move single stage ends by one layer while the bottleneck (then the sum of
    squared loads) drops and memory fits. A heuristic incumbent, not an optimality proof."""
    t0 = time.perf_counter()
    L, placement = inst.n_layers, inst.placement
    bounds = result.partition.bounds[1:-1].tolist()

    def score(b: list[int]) -> tuple[float, float] | None:
        load, mem = inst.evaluate(partition_from_bounds(b, L), placement)
        if not inst.fits(mem):
            return None
        return float(load.max()), float(np.square(load).sum())

    best = score(bounds) or (float("inf"), float("inf"))
    for _ in range(max_rounds):
        improved = False
        for k in range(len(bounds)):
            for step in (-1, 1):
                nb = bounds.copy()
                nb[k] += step
                lo = nb[k - 1] if k else 0
                hi = nb[k + 1] if k + 1 < len(nb) else L
                if not lo < nb[k] < hi:
                    continue
                sc = score(nb)
                if sc is not None and sc < best:
                    best, bounds, improved = sc, nb, True
        if not improved:
            break
    part = partition_from_bounds(bounds, L)
    return make_result(inst, part, placement, "greedy_ls",
                       result.solve_time_s + time.perf_counter() - t0, False)
