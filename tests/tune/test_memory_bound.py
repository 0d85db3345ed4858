"""The memory bound (octopipe.tune.bounds.memory_bound) against every plan of small instances:
every partition, placement and list-scheduling policy the tuner can freeze, simulated by
octopipe.sim with the memory check; no feasible plan is faster than the bound, and the bound is
the binding one (above the device bound) on the tight budgets, so the test can fail."""
import itertools
import math

import numpy as np
import pytest

from octopipe.cost.table import CostTable
from octopipe.tune.bounds import device_bound, memory_bound
from octopipe.tune.candidate import KIND_RANKS, Candidate, Problem

from .helpers import free_cluster, simulated_makespans
from .test_brute_force import _compositions


def _costs(f, act):
    f = np.asarray(f, float)[:, None]
    n = len(f)
    return CostTable(tuple(f"l{j}" for j in range(n)), ("dev",), f, 0.75 * f, 0.5 * f,
                     np.asarray(act, float), np.zeros(n), np.zeros(n), np.zeros(n),
                     tokens_per_microbatch=1)


def _plans(problem):
    L, D = problem.n_layers, problem.n_devices
    for S in range(D, L + 1):
        for sizes in _compositions(L, S):
            for pl in itertools.product(range(D), repeat=S):
                if len(set(pl)) < D:
                    continue
                for split, infl, rank, tb in itertools.product(
                        (True, False), (1.0, 2.0, math.inf), KIND_RANKS, (0, 1)):
                    yield Candidate(sizes, pl, split, infl, rank, tb, tb)


@pytest.mark.parametrize("f,act,D,M,budget", [
    ([1.0, 2.0, 1.5], [4.0, 1.0, 1.0], 2, 4, 4.0),          # one micro-batch of layer 0 at a time
    ([1.0, 1.0, 1.0, 2.0], [2.0, 1.0, 1.0, 1.0], 2, 4, 3.5),     # layer 0 alone, one at a time
])
def test_memory_bound_below_every_simulated_plan(f, act, D, M, budget):
    pb = Problem.build(_costs(f, act), free_cluster(D), D, M, act_budget=budget)
    bound = memory_bound(pb)
    assert bound > device_bound(pb) * (1 + 1e-6)       # the memory term is what binds here
    best, n = math.inf, 0
    for cand, makespan in simulated_makespans(pb, _plans(pb)):
        n += 1
        best = min(best, makespan)
        assert makespan >= bound * (1 - 1e-9), cand.describe()
    assert n > 0
    assert best <= bound * 1.1          # and close: 32.5 vs 31.5, 35.5 vs 35


def test_memory_bound_without_pressure_is_the_round_trip():
    pb = Problem.build(_costs([1.0, 2.0], [1.0, 1.0]), free_cluster(2), 2, 4)
    assert memory_bound(pb) == pytest.approx(1.75 * 3.0)
