"""Exact linear-partition DP (min-max) for a fixed placement with one stage per device.

The project's one min-max DP (`octopipe.plan.min_max_partition`) on this instance's stage
costs: a stage's cost on its device includes the transfers on its two boundaries, and a stage
that does not fit its device's memory is excluded. Ties take the earliest split point.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from octopipe.errors import ConfigError
from octopipe.plan import min_max_partition
from solvers.instance import PartitionInstance
from solvers.partition_result import PartitionResult, make_result


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
    part = min_max_partition(lambda s: stage_cost_matrix(inst, s, placement), inst.n_stages,
                             inst.n_layers, latest_ties=False)
    dt = time.perf_counter() - t0
    if part is None:
        return _infeasible(inst, dt)
    res = make_result(inst, part, placement, "dp", dt, True)
    return replace(res, bound=res.objective)


def _infeasible(inst: PartitionInstance, dt: float) -> PartitionResult:
    return PartitionResult((), inst.placement, float("inf"), (), (), False, True, dt, "dp",
                           status="infeasible")
