"""Partition (one value, three views), the min-max DP, and Plan.pieces (typed, legacy meta read)."""
import itertools

import numpy as np
import pytest

from octopipe.errors import ConfigError, ScheduleError
from octopipe.plan import Partition, Plan, min_max_partition, uniform_partition
from octopipe.plan_io import plan_from_doc, plan_to_doc
from octopipe.schedule.generators import one_f_one_b


def test_sizes_bounds_and_ranges_are_views_of_one_value():
    p = Partition((2, 1, 3))
    assert p.bounds.tolist() == [0, 2, 3, 6]
    assert p.ranges == ((0, 2), (2, 3), (3, 6)) == tuple(p)
    assert (len(p), p.n_stages, p.n_layers, p[1], p[-1][1]) == (3, 3, 6, (2, 3), 6)
    assert Partition.from_ranges(p.ranges) == p == Partition.from_cuts([2, 3], 6)
    assert p == ((0, 2), (2, 3), (3, 6)) and p == [[0, 2], [2, 3], [3, 6]]
    assert p != Partition((3, 3)) and p != ((0, 6),)
    assert hash(p) == hash(p.ranges) and {p: 1}[Partition((2, 1, 3))] == 1
    with pytest.raises(ValueError):
        p.bounds[0] = 1


def test_partitions_reject_empty_or_gapped_stages():
    with pytest.raises(ScheduleError, match="at least one layer"):
        Partition((2, 0, 1))
    with pytest.raises(ScheduleError, match=r"stage 1 = layers \[3, 4\) is not contiguous"):
        Partition.from_ranges(((0, 2), (3, 4)))
    with pytest.raises(ScheduleError, match="need at least 5 layers"):
        Partition.uniform(4, 5)


def test_uniform_puts_the_extra_layers_first():
    assert uniform_partition(10, 4).sizes == (3, 3, 2, 2) == Partition.uniform(10, 4).sizes


def _brute(w, k):
    return min(max(w[a:b].sum() for a, b in zip((0,) + c, c + (len(w),)))
               for c in itertools.combinations(range(1, len(w)), k - 1))


@pytest.mark.parametrize("seed", range(4))
def test_balanced_is_the_min_max_optimum(seed):
    w = np.random.default_rng(seed).uniform(0.5, 3.0, size=8)
    for k in (1, 2, 4, 8):
        p = Partition.balanced(w, k)
        assert max(w[lo:hi].sum() for lo, hi in p) == pytest.approx(_brute(w, k))
    with pytest.raises(ConfigError, match="cannot split 8 layers into 9"):
        Partition.balanced(w, 9)


def test_min_max_ties_take_the_latest_or_the_earliest_cut():
    w = np.ones(4)
    ps = np.concatenate([[0.0], np.cumsum(w)])
    lo, hi = np.arange(5)[:, None], np.arange(5)[None, :]
    span = np.where(hi > lo, np.maximum(ps[hi] - ps[lo], 2.0), np.inf)   # every 1- or 2-layer stage ties
    assert min_max_partition(lambda s: span, 3, 4, latest_ties=True).sizes == (2, 1, 1)
    assert min_max_partition(lambda s: span, 3, 4, latest_ties=False).sizes == (1, 1, 2)
    assert min_max_partition(lambda s: np.full((5, 5), np.inf), 2, 4, latest_ties=True) is None


def test_plan_holds_a_partition_and_typed_pieces():
    table = one_f_one_b(2, 2)
    plan = Plan(((0, 3), (3, 5)), table, pieces={"4": 2})
    assert isinstance(plan.partition, Partition) and plan.partition.sizes == (3, 2)
    assert plan.pieces == {4: 2} and plan.meta == {}
    legacy = Plan(((0, 3), (3, 5)), table, meta={"origin": "x", "pieces": {"4": 2}})
    assert legacy.pieces == {4: 2} and legacy.meta == {"origin": "x"} and legacy == plan
    assert Plan(((0, 3), (3, 5)), table) != plan
    with pytest.raises(ConfigError, match="original layer index"):
        Plan(((0, 3), (3, 5)), table, pieces={"head": "two"})


def test_plan_json_keeps_pieces_in_meta_both_ways():
    table = one_f_one_b(2, 2)
    plan = Plan(((0, 3), (3, 5)), table, meta={"origin": "x"}, pieces={4: 2})
    doc = plan_to_doc(plan)
    assert doc["meta"] == {"origin": "x", "pieces": {"4": 2}} and "pieces" not in doc
    back = plan_from_doc(doc)
    assert back == plan and back.meta == {"origin": "x"}
    assert "pieces" not in plan_to_doc(Plan(((0, 3), (3, 5)), table))["meta"]
