"""Ranking statistics of the fidelity benchmark: spread, Spearman, separated pairs."""
from __future__ import annotations

from itertools import permutations

import numpy as np
import pytest

from octopipe.measure.bench.ranking import judge, pairs, ranks, separated_chain, spearman, spread


def test_spread_is_the_median_and_quartiles():
    sp = spread([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (sp.median, sp.q25, sp.q75, sp.n) == (3.0, 2.0, 4.0, 5)
    assert sp.iqr == 2.0 and sp.relative == pytest.approx(2 / 3)


def test_spearman_matches_the_closed_form_on_every_order_of_five():
    a = [0.3, 0.1, 0.5, 0.2, 0.4]
    for perm in permutations(range(5)):
        b = [float(p) for p in perm]
        d = ranks(a) - ranks(b)
        assert spearman(a, b) == pytest.approx(1 - 6 * np.sum(d * d) / (5 * 24))


def test_ties_share_their_mean_rank():
    assert list(ranks([2.0, 1.0, 2.0, 3.0])) == [2.5, 1.0, 2.5, 4.0]
    assert spearman([1.0, 1.0], [1.0, 2.0]) != spearman([1.0, 1.0], [1.0, 2.0])   # nan: no order
    assert spearman([5.0], [1.0]) == 1.0


def test_pairs_mark_gaps_inside_the_measured_spread_as_noise():
    names = ["a", "b", "c"]
    measured, noise, simulated = [1.0, 1.05, 2.0], [0.1, 0.1, 0.1], [1.08, 1.0, 2.2]
    got = {(p.a, p.b): p for p in pairs(names, measured, noise, simulated)}
    assert not got["a", "b"].separated and not got["a", "b"].same_order
    assert got["a", "c"].separated and got["a", "c"].same_order
    assert got["b", "c"].separated and got["b", "c"].same_order
    assert got["a", "b"].noise_s == 0.1 and got["a", "c"].predicted_gap_s == pytest.approx(1.12)


def test_separated_chain_is_the_largest_mutually_separated_set():
    names = ["a", "b", "c", "d"]
    simulated = [1.0, 1.05, 1.5, 2.0]
    # a and b sit within a's spread; every other pair is apart
    assert separated_chain(names, simulated, [0.1, 0.01, 0.01, 0.01]) in (["a", "c", "d"], ["b", "c", "d"])
    # a spread wider than every gap leaves single schedules only
    assert len(separated_chain(names, simulated, [5.0, 5.0, 5.0, 5.0])) == 1


def test_judge_counts_every_pair_once_and_reports_both_spearmans():
    names = ["gpipe", "1f1b", "zbv"]
    v = judge(names, [1.0, 1.01, 0.5], [0.05, 0.05, 0.05], [1.0, 0.99, 0.6])
    assert v["separated_pairs"] + v["noise_pairs"] == 3 and len(v["pairs"]) == 3
    assert v["separated_pairs"] == 2 and v["separated_pairs_same_order"] == 2
    assert v["noise_pairs"] == 1 and v["noise_pairs_same_order"] == 0
    assert v["spearman_all"] == pytest.approx(0.5)
    assert v["spearman_separated_chain"] == 1.0 and v["separated_chain"][0] == "zbv"


def test_paired_rounds_cancel_drift_that_the_pooled_spread_cannot():
    """Load drifts from round to round by far more than the gap between two schedules, but within
    a round b is always 0.05 s slower: pooled, the pair is within noise; paired, it separates."""
    drift = [0.0, 0.5, 1.0, 1.5]
    a = [1.0 + d for d in drift for _ in range(2)]
    b = [1.05 + d for d in drift for _ in range(2)]
    pooled = [spread(a).iqr, spread(b).iqr]
    (p,) = pairs(["a", "b"], [spread(a).median, spread(b).median], pooled, [1.0, 1.05], [a, b], per_round=2)
    assert not p.separated
    assert p.paired_diff_s == pytest.approx(-0.05) and p.paired_noise_s == pytest.approx(0.0)
    assert p.separated_paired and p.same_order_paired
