"""Exact linear-partition DP (min-max) for a fixed placement with one stage per device.

`best[s][j]` is the smallest bottleneck over the first s+1 stages covering layers [0, j); a
stage's cost on its device includes the transfers on its two boundaries, and a stage that does
not fit its device's memory is excluded. O(S · L²) with the inner minimum vectorized.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from octopipe.errors import ConfigError
from solvers.instance import PartitionInstance, partition_from_bounds
from solvers.result import PartitionResult, make_result


def stage_cost_matrix(inst: PartitionInstance, s: int, placement: tuple[int, ...]) -> np.ndarray:
    """cost[lo, hi] of stage s holding layers [lo, hi) (inf where empty or out of memory)."""
    L, S = inst.n_layers, inst.n_stages
    d = placement[s]
    c = inst.col[d]
    ps = inst.work_ps[:, c]
    lo = np.arange(L + 1)[:, None]
    hi = np.arange(L + 1)[None, :]
    cost = ps[hi] - ps[lo]
    if s > 0 and placement[s - 1] != d:
        link = inst.cluster.link(placement[s - 1], d)
        t_in = link.latency + np.concatenate([[0.0], inst.costs.out_bytes])[lo] / link.bandwidth
        cost = cost + t_in
    if s + 1 < S and placement[s + 1] != d:
        link = inst.cluster.link(d, placement[s + 1])
        t_out = link.latency + np.concatenate([[0.0], inst.costs.out_bytes])[hi] / link.bandwidth
        cost = cost + t_out
    mult = inst.act_mult(placement)[s]
    mem = (inst.static_ps[hi] - inst.static_ps[lo]) + mult * (inst.act_ps[hi] - inst.act_ps[lo])
    bad = (hi <= lo) | (mem > inst.cap[d] * (1 + 1e-9))
    return np.where(bad, np.inf, cost)


def dp_partition(inst: PartitionInstance) -> PartitionResult:
    """Optimal contiguous partition for `inst.placement` (each device holding one stage).

    Returns status "infeasible" (objective inf) when no partition fits memory.
    """
    placement = inst.placement
    if not placement:
        raise ConfigError("dp_partition needs a fixed placement (stage -> device)")
    if len(set(placement)) != len(placement):
        raise ConfigError("dp_partition handles one stage per device; with several stages per "
                          "device use solve_partition (ILP) or brute_force_partition")
    t0 = time.perf_counter()
    L, S = inst.n_layers, inst.n_stages
    best = np.full((S, L + 1), np.inf)
    arg = np.zeros((S, L + 1), dtype=int)
    best[0] = stage_cost_matrix(inst, 0, placement)[0]
    for s in range(1, S):
        cost = stage_cost_matrix(inst, s, placement)          # [lo, hi]
        cand = np.maximum(best[s - 1][:, None], cost)         # [lo, hi]
        arg[s] = np.argmin(cand, axis=0)
        best[s] = cand[arg[s], np.arange(L + 1)]
    dt = time.perf_counter() - t0
    if not np.isfinite(best[S - 1, L]):
        return _infeasible(inst, dt)
    bounds, j = [], L
    for s in range(S - 1, 0, -1):
        j = int(arg[s, j])
        bounds.append(j)
    part = partition_from_bounds(bounds[::-1], L)
    res = make_result(inst, part, placement, "dp", dt, True)
    return replace(res, bound=res.objective)


def _infeasible(inst: PartitionInstance, dt: float) -> PartitionResult:
    return PartitionResult((), inst.placement, float("inf"), (), (), False, True, dt, "dp",
                           status="infeasible")
