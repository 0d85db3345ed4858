"""The layout bound: never above any schedule of the layout, and tight where the optimum is known."""
import math

import numpy as np
import pytest

from octopipe.cost.table import CostTable
from octopipe.tune.candidate import KIND_RANKS, Candidate, Problem
from octopipe.tune.layout_bound import layout_bound, releases_and_tails
from octopipe.tune.search import SearchConfig, search, seed_candidates

from .helpers import free_cluster


def _problem(f, i, w, D, M, latency=0.0):
    f = np.asarray(f, float)
    n = len(f)
    costs = CostTable(tuple(f"l{j}" for j in range(n)), ("dev",), f[:, None],
                      np.asarray(i, float)[:, None], np.asarray(w, float)[:, None],
                      np.ones(n), np.zeros(n), np.full(n, 1e3), np.zeros(n), tokens_per_microbatch=1)
    return Problem.build(costs, free_cluster(D, latency=latency), D, M)


def _optimum(problem: Problem, cand: Candidate) -> float:
    """Shortest schedule of the candidate's actions, by enumerating every order in which a
    serial scheduler may place them (each (stage, kind) in micro-batch order): every schedule
    is the earliest-start schedule of its own start-time order, so the minimum is exact."""
    arr = problem.arrays(cand)
    S, M, D = cand.n_stages, problem.n_microbatches, problem.n_devices
    kinds = 3 if cand.split_backward else 2
    dur, dev = arr.dur, arr.dev
    best = [math.inf]

    def ready(end, s, k, m):
        if k == 0:
            if s == 0:
                return 0.0
            e = end.get((s - 1, 0, m))
            return None if e is None else e + arr.comm_f[s - 1]
        if k == 1:
            e = end.get((s, 0, m))
            if e is None:
                return None
            if s + 1 < S:
                e2 = end.get((s + 1, 1, m))
                return None if e2 is None else max(e, e2 + arr.comm_b[s + 1])
            return e
        return end.get((s, 1, m))

    def rec(end, nxt, free, span):
        if span >= best[0] - 1e-12:
            return
        if len(end) == S * M * kinds:
            best[0] = span
            return
        for s in range(S):
            for k in range(kinds):
                m = nxt[s * 3 + k]
                if m >= M:
                    continue
                r = ready(end, s, k, m)
                if r is None:
                    continue
                t = max(r, free[dev[s]]) + dur[s, k]
                end[(s, k, m)] = t
                nxt[s * 3 + k] += 1
                old = free[dev[s]]
                free[dev[s]] = t
                rec(end, nxt, free, max(span, t))
                free[dev[s]] = old
                nxt[s * 3 + k] -= 1
                del end[(s, k, m)]

    rec({}, [0] * (S * 3), [0.0] * D, 0.0)
    return best[0]


@pytest.mark.parametrize("p,m", [(1, 3), (2, 4), (4, 8)])
def test_tight_on_uniform_1f1b(p, m):
    """Uniform stages, full backward: the bound is 1F1B's closed form (m + p - 1)(F + B), which
    the list scheduler reaches, so no schedule of that layout is shorter."""
    pb = _problem([1.0] * p, [1.2] * p, [0.8] * p, p, m)
    c = Candidate((1,) * p, tuple(range(p)), split_backward=False, inflight=1.0)
    lb = layout_bound(pb, c)
    assert lb.makespan_s == pytest.approx((m + p - 1) * 3.0)
    assert pb.estimate(c).makespan == pytest.approx(lb.makespan_s)


def test_never_above_the_optimum_brute_force():
    """Tiny layouts (random times, transfer delays, split backward or not, two stages on one
    device): bound <= the exact optimum always, equal to it on most."""
    rng = np.random.default_rng(5)
    layouts = [((0, 1), True), ((0, 1), False), ((0, 1, 0, 1), False), ((0, 1, 1, 0), False),
               ((0, 0, 1, 1), False)]
    tight = strict = 0
    for t in range(30):
        pl, split_backward = layouts[t % len(layouts)]
        S = len(pl)
        pb = _problem(rng.integers(1, 5, S), rng.integers(1, 5, S), rng.integers(1, 5, S), 2, 2,
                      latency=float(rng.integers(0, 2)))
        c = Candidate((1,) * S, pl, split_backward=split_backward, inflight=math.inf)
        lb = layout_bound(pb, c).makespan_s
        opt = _optimum(pb, c)
        assert lb <= opt * (1 + 1e-9)
        tight += lb >= opt * (1 - 1e-9)
        strict += lb < opt * (1 - 1e-9)
    assert tight >= 20 and strict >= 1


def test_never_above_the_estimate_on_seed_candidates():
    """Every policy's list schedule is a schedule of its layout."""
    rng = np.random.default_rng(11)
    L, D, M = 12, 4, 6
    pb = _problem(rng.uniform(1, 3, L), rng.uniform(1, 3, L), rng.uniform(0.5, 2, L), D, M, latency=0.1)
    for c in seed_candidates(pb, 3)[::3]:
        for kr in KIND_RANKS:
            x = c.with_(kind_rank=kr)
            assert layout_bound(pb, x).makespan_s <= pb.estimate(x).makespan * (1 + 1e-9)


def test_releases_follow_the_chains():
    """One stage per device, F=1, I=2, W=1: F(s, m) is released at s + m, I of the last stage
    right after its F, and the tail of F(0, 0) is the rest of micro-batch 0's path plus the
    later micro-batches queued behind it on stage 0."""
    S, M = 3, 2
    dur = np.tile([1.0, 2.0, 1.0], (S, 1))
    r, q = releases_and_tails(dur, np.zeros(S), np.zeros(S), M)
    assert r[:, 0].tolist() == [[0, 1], [1, 2], [2, 3]]
    assert r[2, 1].tolist() == [3, 5]
    assert r[0, 2].tolist() == [9, 11]
    # F(0,0) -> F(1,0) -> F(2,0) -> I(2..0, 0) -> I(0, 1) -> W(0, 1): 2 + 6 + 2 + 1 = 11
    assert q[0, 0, 0] == pytest.approx(11.0)


def test_search_reports_the_bound_of_its_best():
    pb = _problem([1.0] * 4, [1.0] * 4, [1.0] * 4, 4, 4)
    out = search(pb, [], SearchConfig(time_budget_s=5, max_iters=5, patience=2))
    assert out.layout_bound_s == pytest.approx(layout_bound(pb, out.best).makespan_s)
    assert out.layout_bound_s <= out.best_makespan * (1 + 1e-9)


def test_a_tuned_plan_reports_its_layout_bound():
    """summary.json's layout bound is the plan's own layout's, at or below its simulated time;
    a table that runs a (stage, kind) out of micro-batch order is outside the bound's class."""
    from dataclasses import replace

    from octopipe.tune import TuneOptions, tune
    from octopipe.tune.freeze import to_plan
    from octopipe.tune.layout_bound import in_microbatch_order, plan_layout_bound

    rng = np.random.default_rng(3)
    f = rng.uniform(1.0, 3.0, 10) * 1e-3
    pb = _problem(f, 1.1 * f, 0.9 * f, 4, 6, latency=1e-4)
    res = tune(pb.costs, pb.cluster, 4, 6, TuneOptions({"max_iters": 10, "patience": 4, "ilp": False}))
    s = res.summary()
    assert s["layout_bound_s"] == pytest.approx(plan_layout_bound(pb.__class__.build(
        pb.costs, pb.cluster, 4, 6, contention=True), res.plan))
    assert 0 < s["layout_bound_s"] <= res.makespan_s * (1 + 1e-9)
    assert s["efficiency_vs_layout_bound"] == pytest.approx(s["layout_bound_s"] / res.makespan_s)
    plan = to_plan(pb, Candidate((5, 5), (0, 1), split_backward=True))
    assert in_microbatch_order(plan)
    row = list(plan.table.rows[0])
    j, k = next((a, b) for a in range(len(row)) for b in range(a + 1, len(row))
                if row[a].stage == row[b].stage and row[a].kind == row[b].kind)
    row[j], row[k] = row[k], row[j]
    swapped = replace(plan, table=plan.table.with_rows([row, *plan.table.rows[1:]]))
    assert not in_microbatch_order(swapped) and plan_layout_bound(pb, swapped) is None
