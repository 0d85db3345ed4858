"""On instances small enough to enumerate every partition, placement and per-device order,
the tuner's plan is as fast as the best one (simulated by the project's simulator)."""
import itertools

import numpy as np
import pytest

from octopipe.cost.table import CostTable
from octopipe.schedule.action import Action, B, F, I, W
from octopipe.tune import Problem, TuneOptions, tune
from octopipe.tune.bounds import layer_bound, lower_bound

from .helpers import free_cluster


def _costs(f):
    f = np.asarray(f, float)[:, None]
    n = len(f)
    return CostTable(tuple(f"l{j}" for j in range(n)), ("dev",), f, 0.75 * f, 0.5 * f,
                     np.ones(n), np.zeros(n), np.zeros(n), np.zeros(n), tokens_per_microbatch=1)


def _compositions(n, k):
    for cuts in itertools.combinations(range(1, n), k - 1):
        b = (0, *cuts, n)
        yield tuple(b[i + 1] - b[i] for i in range(k))


def _orders(acts, before):
    """Every order of `acts` in which each action follows its same-device predecessors."""
    acts = list(acts)

    def rec(done, left):
        if not left:
            yield tuple(done)
            return
        for a in left:
            if all(p in done or p not in acts for p in before(a)):
                yield from rec(done + [a], [x for x in left if x != a])
    yield from rec([], acts)


def longest_path(rows, dur, preds):
    """Makespan of fixed per-device orders without communication: the longest path through data
    edges and row order (an oracle independent of the simulator and the tuner); inf on a cycle."""
    end = {}
    pos = [0] * len(rows)
    free = [0.0] * len(rows)
    left = sum(len(r) for r in rows)
    while left:
        moved = False
        for d, row in enumerate(rows):
            while pos[d] < len(row):
                a = row[pos[d]]
                ps = preds(a)
                if any(p not in end for p in ps):
                    break
                t0 = max([free[d]] + [end[p] for p in ps])
                end[a] = free[d] = t0 + dur(a)
                pos[d] += 1
                left -= 1
                moved = True
        if not moved:
            return np.inf
    return max(end.values())


def brute_force(costs, cluster, D, M, split_options=(False, True), max_stages=None):
    L = costs.n_layers
    best = np.inf
    for S in range(D, (max_stages or L) + 1):
        for sizes in _compositions(L, S):
            for pl in itertools.product(range(D), repeat=S):
                if len(set(pl)) < D:
                    continue
                for split in split_options:
                    bk = I if split else B
                    kinds = (F, bk, W) if split else (F, bk)

                    def before(a, S=S, split=split, bk=bk):
                        s, m = a.stage, a.microbatch
                        if a.kind is F:
                            return [Action(s - 1, F, m)] if s else []
                        if a.kind is W:
                            return [Action(s, I, m)]
                        return [Action(s, F, m)] + ([Action(s + 1, bk, m)] if s + 1 < S else [])
                    per_dev = []
                    for d in range(D):
                        acts = [Action(s, k, m) for s in range(S) if pl[s] == d
                                for m in range(M) for k in kinds]
                        per_dev.append(list(_orders(acts, before)))
                    lo = np.concatenate([[0], np.cumsum(sizes)])
                    stage = {k: [getattr(costs, k)[lo[s]:lo[s + 1], 0].sum() for s in range(S)]
                             for k in "fiw"}

                    def dur(a, stage=stage):
                        s = a.stage
                        if a.kind is F:
                            return stage["f"][s]
                        if a.kind is B:
                            return stage["i"][s] + stage["w"][s]
                        return stage["i" if a.kind is I else "w"][s]
                    for rows in itertools.product(*per_dev):
                        best = min(best, longest_path(rows, dur, before))
    return best


CFG = {"time_budget_s": 20, "max_iters": 60, "patience": 20, "ilp": False, "finalists": 6}


@pytest.mark.parametrize("f,D,M,splits,max_stages", [
    ([1.0, 2.0, 1.5], 2, 1, (False, True), None),     # every partition, placement, order
    ([1.0, 2.0, 1.5], 2, 2, (False,), None),           # full backward only
    ([3.0, 1.0, 1.0, 1.0], 2, 2, (False, True), 2),    # one stage per device, I/W orders too
])
def test_tuner_reaches_brute_force_optimum(f, D, M, splits, max_stages):
    costs, cluster = _costs(f), free_cluster(D)
    opt = brute_force(costs, cluster, D, M, splits, max_stages)
    res = tune(costs, cluster, D, M, TuneOptions(CFG, baselines=False))
    # the tuner searches split backward too, so it may beat a full-backward-only optimum
    assert res.makespan_s <= opt * (1 + 1e-9), f"tuner {res.makespan_s} vs optimum {opt}"
    # the bounds the reports divide by are valid: no plan beats them
    pb = Problem.build(costs, cluster, D, M)
    assert lower_bound(pb.layer_work(), M) <= layer_bound(pb) <= min(opt, res.makespan_s) * (1 + 1e-9)


def test_split_backward_optimum_with_two_microbatches():
    """Full brute force including I/W orders for one stage per device."""
    costs, cluster = _costs([1.0, 2.0]), free_cluster(2)
    opt = brute_force(costs, cluster, 2, 2, (False, True), max_stages=2)
    res = tune(costs, cluster, 2, 2, TuneOptions(CFG, baselines=False))
    assert res.makespan_s <= opt * (1 + 1e-9)


@pytest.mark.parametrize("f,D,M,splits,max_stages", [
    ([1.0, 2.0, 1.5], 2, 1, (False, True), None),
    ([1.0, 2.0, 1.5], 2, 2, (False,), None),
    ([3.0, 1.0, 1.0, 1.0], 2, 2, (False, True), 2),
    ([1.0, 1.0, 1.0], 2, 1, (False, True), None),
])
def test_device_bound_is_valid(f, D, M, splits, max_stages):
    """The whole-layer, fill/drain-aware bound never exceeds the brute-force optimum."""
    from octopipe.tune.bounds import device_bound
    costs, cluster = _costs(f), free_cluster(D)
    opt = brute_force(costs, cluster, D, M, splits, max_stages)
    pb = Problem.build(costs, cluster, D, M)
    assert layer_bound(pb) <= device_bound(pb) <= opt * (1 + 1e-9)


def test_device_bound_counts_whole_layers():
    """Five equal layers on two devices: one device does three of them for every micro-batch."""
    from octopipe.tune.bounds import device_bound
    costs, cluster = _costs([1.0] * 5), free_cluster(2)
    pb = Problem.build(costs, cluster, 2, 4)
    work = 1.0 + 0.75 + 0.5
    assert lower_bound(pb.layer_work(), pb.n_microbatches) == pytest.approx(4 * 5 * work / 2)
    assert device_bound(pb) >= 4 * 3 * work * (1 - 1e-9)
