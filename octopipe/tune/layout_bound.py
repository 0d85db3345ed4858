"""A lower bound on any schedule of one partition + placement: the layout bound.

The search changes three levers; when its best candidate's makespan equals this bound, no
scheduling policy can do better on that partition and placement, and only the layout (or
splitting a layer) can. The bound is an energy argument over time windows:

- every action a = (stage, kind, micro-batch) has a release r(a), the longest chain of
  predecessors before it (data edges with their transfer delays, and the micro-batch order of
  its own stage and kind), and a tail q(a), the longest chain of successors after it;
- a device must run every action with r(a) >= r and q(a) >= q inside [r, T - q], so
  T >= r + q + (their total duration) for every device and every pair (r, q).

It holds for schedules that run each (stage, kind) in micro-batch order, as the list scheduler
and every named schedule do, and for any transfer that takes at least its latency-plus-size
time (the estimator's delays; link contention only adds to them). Memory is ignored.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from octopipe.plan import Plan
from octopipe.tune.candidate import Candidate, Problem

MAX_THRESHOLDS = 64     # release thresholds tried per device (any subset keeps the bound valid)


@dataclass(frozen=True)
class LayoutBound:
    """The bound and the window that sets it: `device` must run `work_s` of compute inside
    [`start_s`, makespan - `tail_s`]."""

    makespan_s: float
    device: int
    start_s: float
    tail_s: float
    work_s: float


def _chain_fwd(a: np.ndarray, step: float) -> np.ndarray:
    """x[m] = max(a[m], x[m-1] + step): the release of a FIFO queue fed at times a."""
    m = np.arange(len(a))
    return m * step + np.maximum.accumulate(a - m * step)


def _chain_bwd(b: np.ndarray, step: float) -> np.ndarray:
    """x[m] = max(b[m], x[m+1] + step): the tail of a FIFO queue whose items leave tails b."""
    m = np.arange(len(b))
    return np.maximum.accumulate((b + m * step)[::-1])[::-1] - m * step


def releases_and_tails(dur: np.ndarray, comm_f: np.ndarray, comm_b: np.ndarray,
                       M: int) -> tuple[np.ndarray, np.ndarray]:
    """[S, 3, M] release and tail of every action (kinds F, I, W; W of zero length when the
    backward is not split). Tails exclude the action's own duration."""
    S = dur.shape[0]
    f, i, w = dur[:, 0], dur[:, 1], dur[:, 2]
    r = np.zeros((S, 3, M))
    q = np.zeros((S, 3, M))
    for s in range(S):
        a = np.zeros(M) if s == 0 else r[s - 1, 0] + f[s - 1] + comm_f[s - 1]
        r[s, 0] = _chain_fwd(a, f[s])
    for s in range(S - 1, -1, -1):
        a = r[s, 0] + f[s]
        if s + 1 < S:
            a = np.maximum(a, r[s + 1, 1] + i[s + 1] + comm_b[s + 1])
        r[s, 1] = _chain_fwd(a, i[s])
        r[s, 2] = _chain_fwd(r[s, 1] + i[s], w[s])
    for s in range(S):
        q[s, 2] = _chain_bwd(np.zeros(M), w[s])
        b = w[s] + q[s, 2]
        if s > 0:
            b = np.maximum(b, comm_b[s] + i[s - 1] + q[s - 1, 1])
        q[s, 1] = _chain_bwd(b, i[s])
    for s in range(S - 1, -1, -1):
        b = i[s] + q[s, 1]
        if s + 1 < S:
            b = np.maximum(b, comm_f[s] + f[s + 1] + q[s + 1, 0])
        q[s, 0] = _chain_bwd(b, f[s])
    return r, q


def _device_window(r: np.ndarray, q: np.ndarray, d: np.ndarray) -> tuple[float, float, float, float]:
    """max over windows of r + q + work for one device's actions: (value, start, tail, work)."""
    order = np.argsort(-q, kind="stable")
    r, q, d = r[order], q[order], d[order]
    ts = np.unique(r)
    if len(ts) > MAX_THRESHOLDS:
        ts = np.unique(np.quantile(ts, np.linspace(0.0, 1.0, MAX_THRESHOLDS), method="lower"))
    inside = r[None, :] >= ts[:, None] - 1e-15      # [thresholds, actions sorted by tail]
    work = np.cumsum(np.where(inside, d[None, :], 0.0), axis=1)
    val = np.where(np.cumsum(inside, axis=1) > 0, ts[:, None] + q[None, :] + work, -np.inf)
    k, j = np.unravel_index(int(np.argmax(val)), val.shape)
    best = (float(val[k, j]), float(ts[k]), float(q[j]), float(work[k, j]))
    chain = r + d + q                                # one action alone (covers dropped thresholds)
    c = int(np.argmax(chain))
    if chain[c] > best[0]:
        best = (float(chain[c]), float(r[c]), float(q[c]), float(d[c]))
    return best


def layout_bound(problem: Problem, cand: Candidate) -> LayoutBound:
    """The largest window load over the candidate's devices (see the module docstring)."""
    arr = problem.arrays(cand)
    M = problem.n_microbatches
    dur = np.asarray(arr.dur, dtype=np.float64)
    r, q = releases_and_tails(dur, np.asarray(arr.comm_f, float), np.asarray(arr.comm_b, float), M)
    d_all = np.broadcast_to(dur[:, :, None], r.shape)
    best = LayoutBound(0.0, 0, 0.0, 0.0, 0.0)
    for dev in range(problem.n_devices):
        stages = np.flatnonzero(arr.dev == dev)
        if len(stages) == 0:
            continue
        v, t, tail, work = _device_window(r[stages].ravel(), q[stages].ravel(), d_all[stages].ravel())
        if v > best.makespan_s:
            best = LayoutBound(v, dev, t, tail, work)
    return best


def in_microbatch_order(plan: Plan) -> bool:
    """True when the plan's table runs each (stage, kind) in micro-batch order on one device per
    stage (no replicas, not lowered): the schedules `layout_bound` speaks of."""
    t = plan.table
    if t.replicas or t.is_lowered:
        return False
    last: dict[tuple[int, str], int] = {}
    for _, a in t:
        key = (a.stage, a.kind.value)
        if last.get(key, -1) >= a.microbatch:
            return False
        last[key] = a.microbatch
    return True


def plan_layout_bound(problem: Problem, plan: Plan) -> float | None:
    """`layout_bound` of a plan's partition and placement (with its backward split or not): no
    table on that layout runs faster, so plan / bound says how much a better schedule alone
    could gain. None for tables outside the bound's class (`in_microbatch_order`)."""
    if not in_microbatch_order(plan):
        return None
    cand = Candidate(plan.partition, plan.placement, split_backward=plan.table.splits_backward)
    return layout_bound(problem, cand).makespan_s
