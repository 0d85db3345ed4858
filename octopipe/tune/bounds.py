"""Lower bounds on an iteration's makespan, from the loosest to the tightest.

- `lower_bound`: the total work shared over the devices, as if layers could be cut anywhere
  (the figure `efficiency_vs_lower_bound` divides by);
- `layer_bound`: layers stay whole, and each owes its fill before it and its drain after it;
- `device_bound`: whole layers and the fill and drain of every device;
- `memory_bound`: whole layers whose activations the devices can hold for only so many
  micro-batches at once (a separate argument; take the larger of it and `device_bound`).

With a few dozen heavy, equal layers on 8 devices the lower bound is far from reachable (25
equal MoE layers on 8 devices put 4 on one of them). The device bound keeps layers whole and
charges each device the fill and drain it cannot avoid:

- sort any plan's devices by the lowest layer they hold; the k-th (from 0) holds no layer below
  k, so its first forward starts at or after `sum f[:k]` (micro-batch 0 crossing layers < k);
- after that device's last input-gradient op (on some layer >= k), the same micro-batch still
  needs the input gradients of the layers below it and layer 0's weight gradient: at least
  `sum i[:k] + w[0]` (k >= 1);
- so T >= start_k + M * work_k and T >= start_k + M * (f + i)_k + chain_k for every device.

Forgetting which layers a device may hold (any layer may sit on any of the sorted slots) keeps
the bound valid and makes it a small integer program over layer *types* (layers with equal
times), solved exactly with CBC (`pulp`). Each bound is never below the one before it.

Where the cost table measured a full backward cheaper than I + W, a plan that does not split
its backward gets a layer's input gradient only after its B: the bounds take the cheaper of the
two (`backward_floor`), so they hold for plans of either kind.
"""
from __future__ import annotations

import math

import numpy as np
import pulp

from octopipe.tune.candidate import Problem
from solvers.backend import cbc


def lower_bound(layer_work: np.ndarray, n_microbatches: int) -> float:
    """Total work over the devices: no bubbles, no exposed transfers, perfect balance.

    `layer_work[l, d]`: seconds of layer l on device d per micro-batch. With mixed device kinds
    each layer is charged at its fastest kind and the work is shared in proportion to device
    speed, which keeps the bound valid.
    """
    work = np.asarray(layer_work, dtype=np.float64)
    speed = work.sum(axis=0)
    per_dev_rate = speed.min() / speed           # relative throughput of each device
    fastest = work.min(axis=1).sum()
    return float(n_microbatches * fastest / per_dev_rate.sum())


def backward_floor(problem: Problem) -> tuple[np.ndarray, float]:
    """[L] the least seconds, over device kinds, from a layer's backward start to its input
    gradient (I, or a full B where that is cheaper), and the least seconds layer 0 then still
    owes to finish its weight gradient (W, or the rest of its B)."""
    c, col = problem.costs, problem.kind_col
    if c.full_b is None:
        return c.i[:, col].min(axis=1), float(c.w[0, col].min())
    b = c.b[:, col]
    i = np.minimum(c.i[:, col], b)
    return i.min(axis=1), float((np.minimum(c.i[0, col] + c.w[0, col], b[0]) - i[0]).min())


def layer_bound(problem: Problem) -> float:
    """A tighter bound for coarse models: layers are never split, so the device holding layer l
    cannot start it before micro-batch 0's forward has crossed every earlier layer, and then
    owes all of layer l's work: max_l (sum_{j<l} f_j + M * work_l). Its weight gradients may
    wait, but after its last input gradient that micro-batch still needs the input gradients of
    every earlier layer and layer 0's weight gradient:
    sum_{j<l} f_j + M * (f_l + i_l) + sum_{j<l} i_j + w_0 (l >= 1). Never below `lower_bound`."""
    c = problem.costs
    f = c.f[:, problem.kind_col].min(axis=1)
    i, w0 = backward_floor(problem)
    work = problem.layer_work().min(axis=1)
    M = problem.n_microbatches
    before = np.concatenate([[0.0], np.cumsum(f)[:-1]])
    chain = np.concatenate([[0.0], np.cumsum(i)[:-1] + w0])
    fill = before + M * work
    drain = before + M * np.minimum(f + i, work) + chain
    return max(lower_bound(problem.layer_work(), M), float(fill.max()), float(drain.max()))


def device_bound(problem: Problem, max_nodes: int = 5000, time_cap_s: float = 120.0) -> float:
    """max(layer bound, min over layer-to-device assignments of the fill/drain-aware load).

    Falls back to `layer_bound(problem)` when CBC does not prove optimality within `max_nodes`
    branch-and-bound nodes (an unproven incumbent is not a bound); the node limit keeps the
    figure the same at any machine load, `time_cap_s` is only a safety cap.
    """
    base = layer_bound(problem)
    c = problem.costs
    f = c.f[:, problem.kind_col].min(axis=1)
    i, w0 = backward_floor(problem)
    work = problem.layer_work().min(axis=1)
    fi = np.minimum(f + i, work)
    M, D = problem.n_microbatches, problem.n_devices
    types: dict[tuple[float, float], int] = {}
    for a, b in zip(np.round(work, 12), np.round(fi, 12)):
        types[(float(a), float(b))] = types.get((float(a), float(b)), 0) + 1
    start = np.concatenate([[0.0], np.cumsum(f)])[:D]
    chain = np.array([0.0] + [float(i[:k].sum() + w0) for k in range(1, D)])
    prob = pulp.LpProblem("device_bound", pulp.LpMinimize)
    T = prob.add_variable("T", lowBound=0)
    n = {(t, k): prob.add_variable(f"n_{t}_{k}", lowBound=0, upBound=cnt, cat="Integer")
         for t, cnt in enumerate(types.values()) for k in range(D)}
    prob += T
    tv = list(types.items())
    for t, (_, cnt) in enumerate(tv):
        prob += pulp.lpSum(n[t, k] for k in range(D)) == cnt
    for k in range(D):
        prob += float(start[k]) + M * pulp.lpSum(tw * n[t, k] for t, ((tw, _), _) in enumerate(tv)) <= T
        prob += (float(start[k]) + float(chain[k])
                      + M * pulp.lpSum(tfi * n[t, k] for t, ((_, tfi), _) in enumerate(tv))) <= T
    prob.solve(cbc(msg=False, timeLimit=time_cap_s, maxNodes=max_nodes))   # serial CBC: see make_solver
    if prob.sol_status != pulp.LpSolutionOptimal or T.value() is None:
        return base
    # CBC's optimum is exact up to its integrality tolerance; shave a hair so the bound stays valid
    return max(base, float(T.value()) * (1 - 1e-9))


def memory_bound(problem: Problem) -> float:
    """Whole layers under memory: a micro-batch holds layer l's activations from its stage's
    forward start to that stage's input-gradient end, at least R_l = sum_{j>=l} (f_j + i_j)
    (the rest of the forward and the backward back to l), and the device holding l fits at
    most K_l = floor(capacity / act_l) of them at once (capacity: its memory less layer l's
    static bytes, within `act_budget`; the largest over devices). M such intervals, at most
    K_l overlapping, split into K_l chains of disjoint ones (interval graphs are perfect), one
    of ceil(M / K_l) intervals; before and after it the stage's own layers' predecessors owe
    their forwards and backwards, so T >= sum_j (f_j + i_j) + (ceil(M / K_l) - 1) * R_l.
    Transfers count as free and every time is the fastest kind's, which keeps it a bound."""
    c = problem.costs
    f = c.f[:, problem.kind_col].min(axis=1)
    i = backward_floor(problem)[0]
    fi = f + i
    rest = np.cumsum(fi[::-1])[::-1]                     # R_l
    tol = 1 + 1e-9                      # the slack `Problem.over_memory` allows
    room = problem.memory_bytes[None, :] * tol - c.static_bytes[:, None]      # [L, D]
    if problem.act_budget is not None:
        room = np.minimum(room, problem.act_budget[None, :] * tol)
    room = room.max(axis=1)
    act = np.asarray(c.act_bytes, dtype=np.float64)
    M = problem.n_microbatches
    best = float(fi.sum())
    for l in np.flatnonzero(act > 0):
        k = int(np.floor(room[l] / act[l]))
        if k < 1:
            continue                    # no plan fits: the tuner says so; no finite bound here
        best = max(best, float(fi.sum() + (math.ceil(M / k) - 1) * rest[l]))
    return best * (1 - 1e-12)
