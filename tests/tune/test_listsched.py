"""The tuner's list-scheduling estimator: closed forms and C/Python agreement."""
import math

import numpy as np
import pytest

from octopipe.cost.table import CostTable
from octopipe.plan import Partition
from octopipe.tune.bounds import lower_bound
from octopipe.tune.candidate import Candidate, Problem
from octopipe.tune.listsched import ListPolicy, StageArrays, c_kernel_available, list_schedule

from .helpers import free_cluster


def _arrays(dev, dur, D, comm=0.0, cap=-1.0):
    S = len(dev)
    return StageArrays(np.asarray(dev, np.int32), np.asarray(dur, float), np.full(S, comm),
                       np.full(S, comm), np.ones(S), np.full(S, 0.5), np.full(D, cap), D)


@pytest.mark.parametrize("p,m", [(1, 1), (2, 3), (4, 8), (5, 2)])
def test_1f1b_closed_form(p, m):
    """Uniform stages, full backward, 1F1B in-flight limits: (m + p - 1)(F + B)."""
    arr = _arrays(range(p), [[1.0, 2.0, 0.0]] * p, p)
    r = list_schedule(arr, m, ListPolicy(split_backward=False, limits=np.arange(p, 0, -1),
                                         kind_rank=(1, 0, 2)))
    assert r.complete
    assert r.makespan == pytest.approx((m + p - 1) * 3.0)
    # 1F1B keeps at most p - s micro-batches in flight on stage s: peak = (p - s) activations
    assert r.peak.tolist() == [float(min(m, p - s)) for s in range(p)]


def test_transfer_delay_adds_per_boundary():
    """One micro-batch through p stages: every boundary delay is paid twice (F and B)."""
    p = 3
    arr = _arrays(range(p), [[1.0, 2.0, 0.0]] * p, p, comm=0.5)
    r = list_schedule(arr, 1, ListPolicy(split_backward=False, limits=np.zeros(p)))
    assert r.makespan == pytest.approx(p * 3.0 + 2 * (p - 1) * 0.5)


def test_memory_deadlock_reported():
    """A device holding stages 0 and 1 with room for one activation cannot run micro-batch 0."""
    arr = _arrays([0, 0], [[1.0, 1.0, 1.0]] * 2, 1, cap=1.0)
    r = list_schedule(arr, 2, ListPolicy(split_backward=True, limits=np.zeros(2)))
    assert not r.complete and math.isinf(r.makespan)


def _random_instance(rng: np.random.Generator, real: bool) -> tuple[StageArrays, int, ListPolicy]:
    """A random pipeline and policy: small integer times and 1-2 stages per device, or
    real-valued times and 2-4 stages per device (deep interleaving)."""
    D = int(rng.integers(1, 5)) if not real else int(rng.integers(2, 7))
    S = D * int(rng.integers(1, 3) if not real else rng.integers(2, 5))
    M = int(rng.integers(1, 6) if not real else rng.integers(1, 9))
    dev = np.array([s % D for s in range(S)], np.int32)
    if not real or rng.random() < 0.5:
        rng.shuffle(dev)
    if real:
        dur, comm_f = rng.random((S, 3)), rng.random(S) * 0.3
        comm_b = np.roll(comm_f, 1)
    else:
        dur = rng.integers(1, 5, (S, 3)).astype(float)
        comm_f, comm_b = rng.integers(0, 2, S).astype(float), rng.integers(0, 2, S).astype(float)
    arr = StageArrays(dev, dur, comm_f, comm_b, np.ones(S), np.full(S, 0.5),
                      np.full(D, -1.0 if rng.random() < 0.5 else float(rng.integers(1, 5 + real))), D,
                      bool(rng.random() < 0.5))
    policy = ListPolicy(split_backward=bool(rng.random() < 0.5), limits=rng.integers(0, 4, S),
                        kind_rank=tuple(int(x) for x in rng.permutation(3)),
                        f_tiebreak=int(rng.integers(2)), b_tiebreak=int(rng.integers(2)),
                        w_pressure=float(rng.random()))
    return arr, M, policy


@pytest.mark.skipif(not c_kernel_available(), reason="no C compiler: only the Python engine exists")
@pytest.mark.parametrize("real,seed,n", [(False, 7, 60), (True, 11, 300)])
def test_c_engine_matches_python_engine(real, seed, n):
    """Every start equal to the bit, also under deep interleaving with real-valued times, where
    the C engine's cached choices of the devices that did not run (it offers them only the queue
    an action made ready) could part from the Python engine's full rescan."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        arr, M, policy = _random_instance(rng, real)
        a = list_schedule(arr, M, policy, use_c=True)
        b = list_schedule(arr, M, policy, use_c=False)
        assert a.complete == b.complete
        if a.complete:
            assert a.makespan == b.makespan
            assert (a.order == b.order).all() and (a.start == b.start).all()


def test_problem_estimate_uses_costs_and_lower_bound():
    costs = CostTable.uniform(8, f=1.0, i=1.0, w=1.0)
    pb = Problem.build(costs, free_cluster(4), 4, 8)
    assert lower_bound(pb.layer_work(), pb.n_microbatches) == pytest.approx(8 * 8 * 3.0 / 4)
    c = Candidate((2, 2, 2, 2), (0, 1, 2, 3), split_backward=False, inflight=1.0, kind_rank=(1, 0, 2))
    r = pb.estimate(c)
    assert r.makespan == pytest.approx((8 + 3) * 6.0)


def test_balance_helpers_against_brute_force():
    import itertools

    from octopipe.tune.balance import lpt_placement, refine_balance
    rng = np.random.default_rng(3)
    for _ in range(40):
        L = int(rng.integers(2, 8))
        S = int(rng.integers(1, L + 1))
        w = rng.random(L)
        sizes = Partition.balanced(w, S).sizes
        ps = np.concatenate([[0.0], np.cumsum(w)])
        got = max(ps[b] - ps[a] for a, b in zip(np.cumsum((0,) + sizes[:-1]), np.cumsum(sizes)))
        best = min(max(ps[b] - ps[a] for a, b in zip((0,) + cuts, cuts + (L,)))
                   for cuts in itertools.combinations(range(1, L), S - 1))
        assert got == pytest.approx(best)
        D = int(rng.integers(1, min(S, 3) + 1))
        pl = lpt_placement(w[:S], D)
        assert set(pl) == set(range(D))
        better = refine_balance(w[:S], pl, D)
        assert set(better) == set(range(D))
        load = lambda p: np.bincount(p, weights=w[:S], minlength=D).max()
        assert load(better) <= load(pl) + 1e-12


@pytest.mark.skipif(not c_kernel_available(), reason="no C compiler: only the Python engine exists")
def test_bounded_estimate_stops_only_above_the_bound():
    """`list_makespan` with a bound: the exact makespan (bit for bit) or NaN, and NaN only when
    the full run's makespan is above the bound; bounds at and around the makespan stop some."""
    from octopipe.tune.listsched import list_makespan
    rng = np.random.default_rng(11)
    stopped = 0
    for _ in range(80):
        D = int(rng.integers(1, 5))
        S = D * int(rng.integers(1, 3))
        M = int(rng.integers(1, 7))
        dev = np.array([s % D for s in range(S)], np.int32)
        rng.shuffle(dev)
        arr = StageArrays(dev, rng.random((S, 3)) + 0.1, rng.random(S) * 0.3, rng.random(S) * 0.3,
                          np.ones(S), np.full(S, 0.5),
                          np.full(D, -1.0 if rng.random() < 0.5 else float(rng.integers(1, 5))), D,
                          bool(rng.random() < 0.5))
        policy = ListPolicy(split_backward=bool(rng.random() < 0.5), limits=rng.integers(0, 4, S),
                            kind_rank=tuple(int(x) for x in rng.permutation(3)))
        full = list_schedule(arr, M, policy).makespan
        assert list_makespan(arr, M, policy) == full
        for bound in (0.5 * full, 0.9 * full, full, 1.1 * full):
            got = list_makespan(arr, M, policy, bound)
            if math.isnan(got):
                stopped += 1
                assert full > bound
            else:
                assert got == full
    assert stopped > 20


def test_problem_arrays_are_the_stage_costs():
    """`Problem.arrays` (stacked prefix sums in one buffer) equals, bit for bit, the arrays built
    from `StageCosts.bind`, split backward or not, with budgets and transfers."""
    from octopipe.cost.stage_costs import StageCosts
    rng = np.random.default_rng(5)
    L, D = 9, 3
    act = rng.random(L) * 4
    costs = CostTable(tuple(f"l{j}" for j in range(L)), ("dev",), rng.random((L, 1)),
                      rng.random((L, 1)), rng.random((L, 1)), act, rng.random(L),
                      rng.random(L) * 1e3, np.zeros(L), w_act_bytes=act * rng.random(L))
    pb = Problem.build(costs, free_cluster(D, memory_bytes=20.0, latency=1e-3, bandwidth=1e5), D, 4,
                       act_budget=6.0)
    for sizes, pl in (((3, 3, 3), (0, 1, 2)), ((1, 2, 2, 1, 3), (2, 0, 1, 0, 2)), ((9,), (1,))):
        for split in (True, False):
            c = Candidate(sizes, pl, split)
            a = pb.arrays(c)
            st = StageCosts.bind(costs, c.partition, c.placement, pb.kind_col)
            dur = (np.stack([st.f, st.i, st.w], axis=1) if split
                   else np.stack([st.f, st.i + st.w, np.zeros_like(st.f)], axis=1))
            t = st.boundary_transfers(pb.cluster)
            cap = np.minimum(pb.memory_bytes - st.per_device(st.static_bytes, D), pb.act_budget)
            want = (st.placement, dur, np.concatenate([t, [0.0]]), np.concatenate([[0.0], t]),
                    st.act_bytes, st.act_bytes - st.w_act_bytes if split else st.act_bytes, cap)
            for got, exp in zip((a.dev, a.dur, a.act, a.free_i, a.cap), want[:2] + want[4:]):
                assert np.array_equal(got, exp)
            for got, exp in zip((a.comm_f, a.comm_b), want[2:4]):     # the link's own formula
                assert np.allclose(got, exp, rtol=1e-12, atol=0)


def test_link_contention_matches_the_simulator():
    """With contention, each directed device pair carries one transfer at a time, as the
    simulator's eager links: the estimate is the frozen table's simulated makespan (loop, V and
    random placements, transfers up to five computes long); as pure delays it is shorter where
    transfers queue."""
    from .helpers import simulated_makespans
    rng = np.random.default_rng(3)
    costs = CostTable.uniform(12, f=1.0, i=1.0, w=1.0)
    shorter = 0
    for k in range(24):
        D, M = int(rng.integers(2, 5)), int(rng.integers(2, 7))
        cl = free_cluster(D, latency=float(rng.choice([0.5, 2.0, 5.0])))
        on, off = (Problem.build(costs, cl, D, M, contention=c) for c in (True, False))
        S = D * int(rng.integers(1, 4))
        place = [s % D for s in range(S)] if k % 3 == 0 else (
            [s % D if (s // D) % 2 == 0 else D - 1 - s % D for s in range(S)] if k % 3 == 1
            else [int(x) for x in rng.integers(0, D, S)])
        cand = Candidate(Partition.uniform(12, S), tuple(place), bool(k % 2), math.inf,
                         kind_rank=((1, 0, 2), (0, 1, 2))[k % 4 // 2])
        [(_, sim)] = list(simulated_makespans(on, [cand]))
        assert on.estimate(cand).makespan == pytest.approx(sim, abs=1e-9)
        shorter += off.estimate(cand).makespan < sim - 1e-9
    assert shorter > 0
