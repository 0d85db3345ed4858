"""The estimator's inputs built in C (`octo_stage_arrays`) against the numpy oracle, bit for bit,
and the packed estimate against `list_makespan` on the oracle's arrays."""
import math

import numpy as np
import pytest

from octopipe.cluster import Cluster, DeviceKind, Link
from octopipe.cost.table import CostTable
from octopipe.tune import listsched
from octopipe.tune.candidate import KIND_RANKS, Candidate, Problem
from octopipe.tune.listsched import c_kernel_available, list_makespan

FIELDS = ("dev", "dur", "comm_f", "comm_b", "act", "free_i", "cap")
needs_c = pytest.mark.skipif(not c_kernel_available(), reason="no C compiler")


def _problem(rng: np.random.Generator) -> Problem:
    """Two device kinds over 1-3 nodes (fast links inside a node, slow ones across), uneven
    layers, static bytes that sometimes leave a device no room, and an optional budget; in half
    the cases a measured full backward below I + W, in half a host time per action."""
    D, K = int(rng.integers(1, 7)), 2
    L = int(rng.integers(D, 30))
    f, i, w = (rng.random((L, K)) * 1e-2 for _ in range(3))
    act = rng.random(L) * 1e9
    static = np.zeros(L) if rng.random() < 0.3 else rng.random(L) * 4e9
    full_b = (i + w) * rng.uniform(0.5, 1.0, (L, K)) if rng.random() < 0.5 else None
    costs = CostTable(tuple(f"l{j}" for j in range(L)), ("a", "b"), f, i, w, act, static, rng.random(L) * 1e8,
                      np.zeros(L), w_act_bytes=act * rng.random(L), full_b=full_b,
                      action_s=float(rng.random() * 1e-3) if rng.random() < 0.5 else 0.0)
    kinds = (DeviceKind("a", 1e14, 2e10, 1e12), DeviceKind("b", 3e14, 6e10, 3e12))
    nodes = int(rng.integers(1, 4))
    cl = Cluster("mixed", kinds, tuple(int(x) for x in rng.integers(0, K, D)),
                 tuple(d * nodes // D for d in range(D)), Link("nv", float(rng.uniform(1e11, 1e12)), 2e-6),
                 Link("ib", float(rng.uniform(1e9, 5e10)), float(rng.uniform(1e-6, 1e-4))))
    choice = rng.integers(3)
    budget = None if choice == 0 else (np.array([k.memory_bytes for k in kinds])[list(cl.device_kind)]
                                       if choice == 1 else rng.random(D) * 3e10)
    return Problem.build(costs, cl, D, int(rng.integers(1, 9)), act_budget=budget,
                         contention=bool(rng.random() < 0.5))


def _candidate(rng: np.random.Generator, pb: Problem, split: bool) -> Candidate:
    L, D = pb.n_layers, pb.n_devices
    S = int(rng.integers(1, min(L, 3 * D) + 1))
    cuts = np.sort(rng.choice(np.arange(1, L), S - 1, replace=False)) if S > 1 else np.array([], int)
    sizes = np.diff(np.concatenate([[0], cuts, [L]]))
    place = [s % D for s in range(S)] if rng.random() < 0.5 else rng.integers(0, D, S)
    return Candidate(tuple(int(x) for x in sizes), tuple(int(x) for x in place), split,
                     float(rng.choice([0.5, 1.0, 2.0, math.inf])), KIND_RANKS[rng.integers(3)],
                     int(rng.integers(2)), int(rng.integers(2)), float(rng.choice([0.5, 0.9, 2.0])))


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _twin(pb: Problem) -> Problem:
    """The same problem with empty caches."""
    return Problem.build(pb.costs, pb.cluster, pb.n_devices, pb.n_microbatches, pb.semantics, pb.act_budget,
                         pb.contention)


@needs_c
@pytest.mark.parametrize("seed", range(4))
def test_c_arrays_are_the_numpy_arrays_bit_for_bit(seed):
    """Random partitions and placements, split backward or not, with and without a budget,
    on clusters with mixed kinds and links: every array has the numpy path's bytes (whether
    `arrays` or an estimate filled them), and the estimate, bounded or not, is `list_makespan`'s
    on the numpy arrays (inf where a capacity is negative)."""
    rng = np.random.default_rng(seed)
    seen_unfit = seen_fit = 0
    for _ in range(25):
        pb = _problem(rng)
        for _ in range(6):
            split = bool(rng.random() < 0.5)
            c = _candidate(rng, pb, split)
            want = pb._arrays_numpy(c)
            fits = not (want.cap < 0).any()
            seen_fit, seen_unfit = seen_fit + fits, seen_unfit + (not fits)
            full = list_makespan(want, pb.n_microbatches, c.list_policy(pb.n_devices)) if fits else math.inf
            estimated = _twin(pb)
            assert _same(estimated.estimate_makespan(c), full)           # fills the arrays
            for got in (pb.arrays(c), estimated.arrays(c)):
                for name in FIELDS:
                    g, w = getattr(got, name), getattr(want, name)
                    assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes(), name
                    assert not g.flags.writeable
            assert _same(pb.estimate_makespan(c), full)                  # on the arrays `arrays` filled
            if fits:
                for bound in (full * 0.9, full, full * 1.1):
                    assert _same(_twin(pb).estimate_makespan(c, bound),
                                 list_makespan(want, pb.n_microbatches, c.list_policy(pb.n_devices), bound))
    assert seen_fit > 20 and seen_unfit > 3


def test_without_c_the_problem_uses_numpy_and_python(monkeypatch):
    """No compiler: `arrays` and the estimate come from the numpy and Python paths, with the
    C engine's values."""
    rng = np.random.default_rng(7)
    pairs = []
    for _ in range(6):
        pb = _problem(rng)
        pairs += [(pb, _candidate(rng, pb, bool(rng.random() < 0.5))) for _ in range(4)]
    want = [pb.estimate_makespan(c) for pb, c in pairs]
    monkeypatch.setattr(listsched, "_LIB", False)
    for (pb, c), w in zip(pairs, want):
        fresh = _twin(pb)
        assert isinstance(fresh._layout(c), listsched.StageArrays)
        assert _same(fresh.estimate_makespan(c), w)
