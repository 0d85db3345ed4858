"""The fill/drain bound (octopipe.tune.fill_drain) against every plan of tiny instances (every
partition, placement, empty devices included, and list-scheduling policy, simulated by
octopipe.sim), its MILP against brute force over layer-to-device partitions, and the uniform
chain's closed form (p equal layers on p devices: T >= max((p - 1) f + M w, q_{p-1} + M (f + i)))."""
import itertools
import math

import numpy as np
import pytest

from octopipe.cost.table import CostTable
from octopipe.tune import TuneOptions, tune
from octopipe.tune.bounds import device_bound, layer_bound, lower_bound
from octopipe.tune.candidate import KIND_RANKS, Candidate, Problem
from octopipe.tune.fill_drain import (
    Terms,
    contiguous_bound,
    exact,
    fill_drain,
    fill_drain_bound,
    fitted_partition,
    greedy_partition,
    improve,
    relaxed,
)

from .helpers import free_cluster, simulated_makespans
from .test_brute_force import _compositions


def _costs(f, i, w, b=None, action_s=0.0):
    f, i, w = (np.asarray(x, float)[:, None] for x in (f, i, w))
    n = len(f)
    return CostTable(tuple(f"l{j}" for j in range(n)), ("dev",), f, i, w, np.ones(n), np.zeros(n),
                     np.zeros(n), np.zeros(n), tokens_per_microbatch=1,
                     full_b=None if b is None else np.asarray(b, float)[:, None], action_s=action_s)


def _plans(problem, policies):
    L, D = problem.n_layers, problem.n_devices
    for S in range(1, L + 1):
        for sizes in _compositions(L, S):
            for pl in itertools.product(range(D), repeat=S):
                for split, infl, rank in policies:
                    yield Candidate(sizes, pl, split, infl, rank)


def _best_simulated(pb, policies):
    got = [ms for _, ms in simulated_makespans(pb, _plans(pb, policies))]
    assert got
    return min(got)


ALL = list(itertools.product((True, False), (1.0, 2.0, math.inf), KIND_RANKS))


@pytest.mark.parametrize("f,i,w,D,M", [
    ([1.0, 3.0, 1.0, 0.5], [0.0, 3.0, 1.0, 0.5], [0.5, 2.0, 1.0, 3.0], 2, 3),   # a heavy layer 1
    ([0.5, 0.5, 2.0], [0.5, 0.5, 2.0], [0.5, 0.5, 1.0], 3, 2),                   # a heavy last layer
    ([1.0, 1.0, 1.0, 1.0, 1.0], [1.0] * 5, [0.2] * 5, 2, 2),                      # few micro-batches
])
def test_no_simulated_plan_beats_the_bound(f, i, w, D, M):
    pb = Problem.build(_costs(f, i, w), free_cluster(D), D, M)
    fd = fill_drain(pb)
    assert fd.how in ("exact", "relaxed=partition")             # tiny: proven exactly
    assert fd.bound_s >= device_bound(pb) * (1 - 1e-9)
    assert fd.bound_s >= layer_bound(pb) * (1 - 1e-9)
    assert fd.bound_s >= lower_bound(pb.layer_work(), M) * (1 - 1e-9)
    best = _best_simulated(pb, ALL)
    assert best >= fd.bound_s * (1 - 1e-9)
    assert best <= fd.partition_s * 1.5          # and not far below what the argument allows


@pytest.mark.parametrize("f,i,w,b,h,D,M", [
    ([1.0, 3.0, 1.0, 0.5], [0.0, 3.0, 1.0, 0.5], [0.5, 2.0, 1.0, 3.0], [0.4, 3.0, 1.2, 2.0], 0.0, 2, 3),
    ([0.5, 0.5, 2.0], [0.5, 0.5, 2.0], [0.5, 0.5, 1.0], [0.6, 0.5, 1.5], 0.1, 3, 2),
    ([1.0] * 4, [1.0] * 4, [0.5] * 4, [0.9] * 4, 0.2, 2, 2),
])
def test_a_full_backward_below_i_plus_w_keeps_every_bound_valid(f, i, w, b, h, D, M):
    """Where a measured B costs less than I + W (a plan without split backwards then does less
    work, and gets its input gradients after B), with or without host time per action, no
    simulated plan of either kind beats any bound."""
    pb = Problem.build(_costs(f, i, w, b, h), free_cluster(D), D, M)
    best = _best_simulated(pb, ALL)
    assert best >= fill_drain(pb).bound_s * (1 - 1e-9)
    assert best >= device_bound(pb) * (1 - 1e-9)
    assert best >= layer_bound(pb) * (1 - 1e-9)
    assert best >= lower_bound(pb.layer_work(), M) * (1 - 1e-9)


def test_the_bound_is_above_the_device_bound_where_the_layer_order_matters():
    # the device bound's second device starts after layer 0 (3) whatever it holds; here any
    # split leaves a device whose lowest layer, or whose work after a later layer, waits longer
    pb = Problem.build(_costs([3.0, 2.0, 1.0, 3.0], [3.0, 2.0, 1.0, 3.0], [1.0, 1.0, 2.0, 2.0]),
                       free_cluster(2), 2, 2)
    fd = fill_drain(pb)
    assert fd.bound_s == pytest.approx(29.0, rel=1e-8)
    assert device_bound(pb) == pytest.approx(26.0, rel=1e-8)
    assert _best_simulated(pb, ALL) >= fd.bound_s * (1 - 1e-9)


@pytest.mark.parametrize("p,M", [(3, 4), (3, 2), (2, 3)])
def test_uniform_chain_closed_form_and_tight(p, M):
    # p equal layers, F = I = W = 1, p devices: the last device starts at p - 1 and owes 3M, or
    # its last I ends after (p - 1) + 2M and p - 1 input gradients and W_0 follow
    pb = Problem.build(_costs([1.0] * p, [1.0] * p, [1.0] * p), free_cluster(p), p, M)
    want = max((p - 1) + 3 * M, 2 * (p - 1) + 1 + 2 * M)
    assert fill_drain_bound(pb) == pytest.approx(want, rel=1e-8)
    assert lower_bound(pb.layer_work(), M) == pytest.approx(3 * M)
    zb = [(True, x, (1, 0, 2)) for x in (1.0, 2.0, math.inf)]      # zero-bubble policies
    assert _best_simulated(pb, zb) == pytest.approx(want, rel=1e-9)


def _random_instance(seed: int, L: int, D: int, M: int) -> tuple[Problem, Terms]:
    """L layers with F, I, W drawn from [0.2, 2) on D free-link devices, M micro-batches."""
    rng = np.random.default_rng(seed)
    f, i, w = (rng.uniform(0.2, 2.0, L) for _ in range(3))
    pb = Problem.build(_costs(f, i, w), free_cluster(D), D, M)
    return pb, Terms.of(pb)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_milp_is_the_least_cost_partition(seed):
    L, D, M = 5, 3, 3
    pb, t = _random_instance(seed, L, D, M)
    brute = min(t.cost(np.array(o)) for o in itertools.product(range(D), repeat=L))
    assert exact(t, 0.0, 10_000, 60.0) == pytest.approx(brute, rel=1e-7)
    assert relaxed(t, pb.layer_work()) <= brute * (1 + 1e-12)           # the closed form relaxes it
    assert t.cost(improve(t, greedy_partition(t))) >= brute * (1 - 1e-12)
    fitted = fitted_partition(t, 0.0, 10 * brute)
    assert fitted is not None and t.cost(fitted) >= brute * (1 - 1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_contiguous_bound_is_the_least_contiguous_partition(seed):
    L, D, M = 6, 3, 4
    pb, t = _random_instance(seed, L, D, M)
    brute = min(t.cost(np.repeat(np.arange(S), sizes)) for S in range(1, D + 1)
                for sizes in _compositions(L, S))
    got = contiguous_bound(pb)
    assert brute * (1 - 2e-9) <= got <= brute
    assert got >= fill_drain_bound(pb) * (1 - 1e-9)     # interleaving can only help


def test_tuner_summary_reports_the_bound():
    costs = _costs([1.0, 2.0, 1.5, 1.0], [1.0, 2.0, 1.5, 1.0], [0.5, 1.0, 0.75, 0.5])
    res = tune(costs, free_cluster(2), 2, 4, TuneOptions())
    s = res.summary()
    assert s["lower_bound_s"] <= s["fill_drain_bound_s"] <= s["makespan_s"] * (1 + 1e-9)
    assert s["efficiency_vs_fill_drain_bound"] == pytest.approx(s["fill_drain_bound_s"] / s["makespan_s"])
    assert s["fill_drain_bound_s"] <= s["fill_drain_partition_s"]
    assert s["contiguous_bound_s"] >= s["lower_bound_s"]
