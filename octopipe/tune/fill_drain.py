"""The fill/drain bound: whole layers (or pieces) in their real order, and the fill and drain of
every device, whatever layers it holds (interleaved placements included).

The argument, at the simulator's dependencies (`octopipe.sim.program`: F(s,m) after F(s-1,m);
I or B(s,m) after F(s,m) and after I/B(s+1,m); W(s,m) after I(s,m); a device runs one compute
node at a time; transfers take time >= 0 and are counted as free). Times are the fastest
kind's, `r_l = sum f[:l]`, `q_l = r_l + sum i[:l] + w_0`. For any device k and any layer l it
holds:

- fill: all of k's work on layers >= l runs after r_l (a stage's F starts after micro-batch
  m's forward has crossed every earlier stage, and the part of it on layers >= l comes last;
  its I, W or B come after it), so T >= r_l + M * sum_{l' >= l on k} work_l';
- drain: every F and I (or B) on k of layers >= l, for every micro-batch, ends at or before
  the last I (B) of the stage holding l, which also still owes the input gradient of its
  layers below l; after it, the same micro-batch owes the I (B) of every earlier stage and
  then the W of stage 0 (with B: stage 0's B holds both): T >= q_l + M * sum_{l' >= l on k}
  (f + i)_l'.

At k's lowest layer this is the device bound's argument with the layer known (the k-th device
by lowest layer starts at `sum f[:l_k]`, not only `sum f[:k]`); at every layer it also
contains the layer bound. A plan is a partition of the layers over at most D devices (empty
devices allowed, so every plan the simulator accepts is covered); the bound is the least, over
partitions, of the largest term. That is NP-hard in general (it contains P||Cmax), so:

- `relaxed` (closed form, valid for any plan): the n devices that hold layers >= l have n
  distinct lowest such layers, so n T >= M * work[l:].sum() + r_l + ... + r_{l+n-1} and the
  same with q and f + i, for the least n <= min(D, L - l) that allows it; each layer alone (the
  layer bound); of the D j + 1 heaviest layers, j + 1 on one device; the lower bound;
- `exact` (a MILP with CBC, on instances up to `max_cells` layer x device cells): binaries
  a[l, k], devices ordered by lowest layer; an optimum proven within `max_nodes` nodes is the
  bound, an unproven incumbent is not (the node limit keeps it the same at any load);
- `greedy_partition`, `fitted_partition` (best fit under a bisected target) and `improve`
  (local search): partitions whose cost is an upper end: no fill/drain argument of this form
  can prove more than it;
- `contiguous_bound`: the exact least over one-block-per-device plans (not a bound for
  interleaved ones, which may beat it).

`fill_drain` returns the largest proven figure with that upper end, so a report can say how much
room the argument leaves. Where the MILP runs it is never below `device_bound` (which it
contains); elsewhere the closed form can fall a hair below it where packing whole layers of
equal types matters (0.04% on nemotron_h_8b at pp = 4), and it is milliseconds, not seconds.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pulp

from octopipe.tune.bounds import backward_floor, device_bound, lower_bound
from octopipe.tune.candidate import Problem
from solvers.backend import cbc

MAX_CELLS = 60            # layers x devices the exact MILP (and the device bound under it) is tried on
MAX_NODES = 2000


@dataclass(frozen=True)
class Terms:
    """Per-layer figures of the argument: release r, tail q, work and f + i (seconds)."""

    r: np.ndarray
    q: np.ndarray
    work: np.ndarray
    fi: np.ndarray
    n_microbatches: int
    n_devices: int

    @classmethod
    def of(cls, problem: Problem) -> Terms:
        c, col = problem.costs, problem.kind_col
        f = c.f[:, col].min(axis=1)
        i, w0 = backward_floor(problem)
        work = problem.layer_work().min(axis=1)
        r = np.concatenate([[0.0], np.cumsum(f)[:-1]])
        q = r + np.concatenate([[0.0], np.cumsum(i)[:-1]]) + w0
        return cls(r, q, work, np.minimum(f + i, work), problem.n_microbatches, problem.n_devices)

    @property
    def n_layers(self) -> int:
        return len(self.r)

    def cost(self, owner: np.ndarray) -> float:
        """The largest term of the partition `owner[l]` = device of layer l."""
        M, best = self.n_microbatches, 0.0
        for k in np.unique(owner):
            held = np.flatnonzero(owner == k)
            sw = np.cumsum(self.work[held][::-1])[::-1]
            sf = np.cumsum(self.fi[held][::-1])[::-1]
            best = max(best, float((self.r[held] + M * sw).max()), float((self.q[held] + M * sf).max()))
        return best


@dataclass(frozen=True)
class FillDrain:
    """The bound, how it was proven, and the cost of the best partition found (an upper end)."""

    bound_s: float
    how: str                      # "relaxed", "relaxed=partition", "exact", "device_bound"
    partition_s: float

    @property
    def room(self) -> float:
        """How far above the bound a fill/drain argument could still go (0: the bound is exact)."""
        return self.partition_s / self.bound_s - 1.0


def relaxed(t: Terms, layer_work: np.ndarray) -> float:
    """The closed-form bound: each layer alone, and each suffix shared over the devices that
    hold it. If n devices hold layers >= l, their lowest such layers are n distinct layers >= l,
    so their releases sum to at least r_l + ... + r_{l+n-1} (r rises), and
    n T >= M * work[l:].sum() + that sum (the same with q and f + i); n is unknown, so the least
    over n <= min(D, L - l) of the larger of the two."""
    M, L, D = t.n_microbatches, t.n_layers, t.n_devices
    suf_w = np.cumsum(t.work[::-1])[::-1]
    suf_f = np.cumsum(t.fi[::-1])[::-1]
    cr = np.concatenate([[0.0], np.cumsum(t.r)])
    cq = np.concatenate([[0.0], np.cumsum(t.q)])
    n = np.arange(1, D + 1)[None, :]                          # [1, D]
    top = np.minimum(np.arange(L)[:, None] + n, L)            # [L, D] index l + n, clipped
    lo = np.arange(L)[:, None]
    fill = (M * suf_w[:, None] + cr[top] - cr[lo]) / n
    drain = (M * suf_f[:, None] + cq[top] - cq[lo]) / n
    both = np.where(lo + n <= L, np.maximum(fill, drain), np.inf)
    shared = both.min(axis=1)                                 # [L]: the least over n
    single = np.maximum(t.r + M * t.work, t.q + M * t.fi)
    return max(lower_bound(layer_work, M), float(single.max()), float(shared.max()), packed(t))


def packed(t: Terms) -> float:
    """Pigeonhole: of the D j + 1 heaviest layers some device holds j + 1, at least the j + 1
    lightest of them, and starts at or after the earliest release among them."""
    M, D, L = t.n_microbatches, t.n_devices, t.n_layers
    order = np.argsort(-t.work, kind="stable")
    best = 0.0
    for j in range(1, (L - 1) // D + 1):
        top = order[:D * j + 1]
        best = max(best, float(t.r[top].min() + M * t.work[top][-(j + 1):].sum()))
    return best


def greedy_partition(t: Terms) -> np.ndarray:
    """Layers from the last to the first, each to the device whose largest term grows least
    (lowest index on ties): a partition whose cost bounds the exact figure from above."""
    M, D = t.n_microbatches, t.n_devices
    sw, sf, cost = np.zeros(D), np.zeros(D), np.zeros(D)
    owner = np.zeros(t.n_layers, dtype=np.int64)
    for l in range(t.n_layers - 1, -1, -1):
        new = np.maximum(cost, np.maximum(t.r[l] + M * (sw + t.work[l]), t.q[l] + M * (sf + t.fi[l])))
        k = int(np.argmin(new))
        owner[l], cost[k] = k, new[k]
        sw[k] += t.work[l]
        sf[k] += t.fi[l]
    return owner


def fitted_partition(t: Terms, low: float, high: float, steps: int = 40) -> np.ndarray | None:
    """Best fit under a target: layers from the last to the first, each to the device it fits
    with least room left under T; T by bisection between `low` and `high`. The partition of the
    least T that fits (None when none does below `high`)."""
    M, D = t.n_microbatches, t.n_devices
    best = None
    for _ in range(steps):
        mid = 0.5 * (low + high)
        sw, sf, cost = np.zeros(D), np.zeros(D), np.zeros(D)
        owner = np.zeros(t.n_layers, dtype=np.int64)
        for l in range(t.n_layers - 1, -1, -1):
            new = np.maximum(cost, np.maximum(t.r[l] + M * (sw + t.work[l]), t.q[l] + M * (sf + t.fi[l])))
            fits = np.flatnonzero(new <= mid)
            if len(fits) == 0:
                break
            k = int(fits[np.argmax(new[fits])])
            owner[l], cost[k] = k, new[k]
            sw[k] += t.work[l]
            sf[k] += t.fi[l]
        else:
            best, high = owner, mid
            continue
        low = mid
    return best


def _cost_of(t: Terms, held: list[int]) -> float:
    """The largest term of one device holding the layers `held` (ascending)."""
    M, sw, sf, best = t.n_microbatches, 0.0, 0.0, 0.0
    r, q, work, fi = t.r, t.q, t.work, t.fi
    for l in reversed(held):
        sw += work[l]
        sf += fi[l]
        best = max(best, r[l] + M * sw, q[l] + M * sf)
    return best


def improve(t: Terms, owner: np.ndarray, max_rounds: int = 2000) -> np.ndarray:
    """Local search on a partition: move a layer off, or swap one with, the most loaded device
    while that pair's largest term drops (deterministic; at most `max_rounds` accepted steps)."""
    D = t.n_devices
    r, q, work, fi = (x.tolist() for x in (t.r, t.q, t.work, t.fi))
    lite = Terms(r, q, work, fi, t.n_microbatches, D)         # plain lists: faster per layer
    sets = [sorted(np.flatnonzero(owner == k).tolist()) for k in range(D)]
    cost = [_cost_of(lite, s) for s in sets]
    for _ in range(max_rounds):
        top = max(range(D), key=lambda k: (cost[k], -k))
        step = _best_step(lite, sets, cost, top)
        if step is None:
            break
        k, new_top, new_k, c_top, c_k = step
        sets[top], sets[k], cost[top], cost[k] = new_top, new_k, c_top, c_k
    out = np.empty(t.n_layers, dtype=np.int64)
    for k, s in enumerate(sets):
        out[s] = k
    return out


def _best_step(t: Terms, sets: list[list[int]], cost: list[float], top: int):
    """The first move (then swap) of a layer of device `top` that lowers the pair's largest
    term below `cost[top]`, or None."""
    limit = cost[top] * (1 - 1e-12)
    for l in sets[top]:
        rest = [x for x in sets[top] if x != l]
        c_top = _cost_of(t, rest)
        if c_top >= limit:
            continue
        for k in range(len(sets)):
            if k == top:
                continue
            new_k = sorted(sets[k] + [l])
            c_k = _cost_of(t, new_k)
            if c_k < limit:
                return k, rest, new_k, c_top, c_k
    for l in sets[top]:
        rest = [x for x in sets[top] if x != l]
        for k in range(len(sets)):
            if k == top:
                continue
            for m in sets[k]:
                if t.work[m] >= t.work[l]:
                    continue
                new_top = sorted(rest + [m])
                c_top = _cost_of(t, new_top)
                if c_top >= limit:
                    continue
                new_k = sorted([x for x in sets[k] if x != m] + [l])
                c_k = _cost_of(t, new_k)
                if c_k < limit:
                    return k, new_top, new_k, c_top, c_k
    return None


def exact(t: Terms, floor: float, max_nodes: int, time_cap_s: float) -> float | None:
    """The least largest term over partitions (MILP, CBC), or None when CBC does not prove it
    within `max_nodes` nodes. `floor` (a proven bound) is T's lower bound, which prunes."""
    L, M = t.n_layers, t.n_microbatches
    K = min(t.n_devices, L)
    prob = pulp.LpProblem("fill_drain", pulp.LpMinimize)
    T = prob.add_variable("T", lowBound=floor)
    prob += T
    # a[l, k]: layer l on device k; devices ordered by lowest layer, so k holds no layer < k
    a = {(l, k): prob.add_variable(f"a_{l}_{k}", cat="Binary") for k in range(K) for l in range(k, L)}
    for l in range(L):
        prob += pulp.lpSum(a[l, k] for k in range(min(l + 1, K))) == 1
    for k in range(1, K):
        for l in range(k, L):       # k takes l only if k - 1 holds a layer below l
            prob += a[l, k] <= pulp.lpSum(a[j, k - 1] for j in range(k - 1, l))
    for k in range(K):
        sw_next = sf_next = 0.0
        for l in range(L - 1, k - 1, -1):
            sw = prob.add_variable(f"sw_{l}_{k}", lowBound=0)
            sf = prob.add_variable(f"sf_{l}_{k}", lowBound=0)
            prob += sw == float(t.work[l]) * a[l, k] + sw_next
            prob += sf == float(t.fi[l]) * a[l, k] + sf_next
            prob += float(t.r[l]) * a[l, k] + M * sw <= T
            prob += float(t.q[l]) * a[l, k] + M * sf <= T
            sw_next, sf_next = sw, sf
    prob.solve(cbc(msg=False, timeLimit=time_cap_s, maxNodes=max_nodes))   # serial CBC: see make_solver
    if prob.sol_status != pulp.LpSolutionOptimal or T.value() is None:
        return None
    # CBC's optimum is exact up to its integrality tolerance; shave a hair so the bound stays valid
    return float(T.value()) * (1 - 1e-9)


def fill_drain(problem: Problem, max_nodes: int = MAX_NODES, max_cells: int = MAX_CELLS,
               time_cap_s: float = 60.0) -> FillDrain:
    """The fill/drain bound of `problem` on its own layers (pieces, for a split model): the
    relaxed figure, or on instances of at most `max_cells` layer x device cells the larger of
    `device_bound` and the MILP's proven optimum; with the cost of the best partition found
    (greedy, best fit, local search) as the upper end."""
    t = Terms.of(problem)
    low = relaxed(t, problem.layer_work())
    upper = max(t.cost(improve(t, greedy_partition(t))), low)
    fitted = fitted_partition(t, low, upper)
    if fitted is not None:
        upper = max(min(upper, t.cost(improve(t, fitted))), low)
    if upper <= low * (1 + 1e-9):
        return FillDrain(low, "relaxed=partition", upper)
    best, how = low, "relaxed"
    if t.n_layers * min(t.n_devices, t.n_layers) <= max_cells:
        dev = device_bound(problem, time_cap_s=time_cap_s)
        best, how = (low, "relaxed") if low >= dev else (dev, "device_bound")
        got = exact(t, best, max_nodes, time_cap_s)
        if got is not None:
            best, how = max(best, got), "exact"
    return FillDrain(best, how, max(upper, best))


def contiguous_bound(problem: Problem) -> float:
    """The same argument for contiguous plans only (each device one block of consecutive layers;
    not a bound for interleaved ones): a block [a, b) costs max(r_a + M * work[a:b].sum(),
    q_a + M * (f + i)[a:b].sum()) (its lowest layer binds, as r and q grow by less than M times
    the work they skip), which falls as a rises, so for a target T the greedy longest blocks
    use the fewest devices; T by bisection to a relative 1e-9 (each step halves the interval)."""
    t = Terms.of(problem)
    M, L, D = t.n_microbatches, t.n_layers, t.n_devices
    cw = np.concatenate([[0.0], np.cumsum(t.work)])
    cf = np.concatenate([[0.0], np.cumsum(t.fi)])

    def blocks(T: float) -> int:
        a, n = 0, 0
        while a < L:
            ends = np.arange(a + 1, L + 1)
            ok = np.maximum(t.r[a] + M * (cw[ends] - cw[a]), t.q[a] + M * (cf[ends] - cf[a])) <= T
            if not ok[0]:
                return L + 1
            a = int(ends[np.flatnonzero(ok)[-1]])
            n += 1
        return n

    low, high = 0.0, float(max(t.r[0] + M * cw[-1], t.q[0] + M * cf[-1]))
    while high - low > 1e-9 * high:
        mid = 0.5 * (low + high)
        if blocks(mid) <= D:
            high = mid
        else:
            low = mid
    return low


def fill_drain_bound(problem: Problem) -> float:
    """`fill_drain(problem).bound_s`: no plan on these layers beats it."""
    return fill_drain(problem).bound_s
