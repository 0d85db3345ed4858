"""experiment=rrfp's real-compute measurement: alternating launches over rounds, and the median
and spread across rounds, and the A/B launches' pooled pairs, against a fake launcher and fake
results (no processes)."""
from types import SimpleNamespace

import numpy as np
import pytest

from octopipe.experiments import rrfp


def test_rounds_alternate_strict_and_hints_reversed_every_other_round():
    seen = []

    def launch(job):
        seen.append(job)
        return f"{job}#{sum(j == job for j in seen)}"
    got = rrfp.alternate({None: "strict", "bf": "bf", "bfw": "bfw"}, 4, launch)
    assert seen == ["strict", "bf", "bfw", "bfw", "bf", "strict", "strict", "bf", "bfw", "bfw", "bf", "strict"]
    assert got == {k: [f"{j}#{r}" for r in range(1, 5)] for k, j in (((None, "strict")), ("bf", "bf"), ("bfw", "bfw"))}
    assert rrfp.alternate({None: "strict"}, 1, launch) == {None: ["strict#5"]}


def test_speedup_is_the_median_over_rounds_of_each_rounds_paired_ratio():
    """Each round pairs strict's iteration i with ready-first's iteration i (the same draws) over
    the measured iterations only; the point is the median of the rounds' mean ratios and its
    spread half their interquartile range, so one launch's speed state (a slow round) moves the
    spread, not the point."""
    measured = range(1, 3)                                   # iteration 0 is the warm-up
    strict = [[9.0, 2.0, 4.0], [9.0, 3.0, 3.0], [9.0, 2.0, 2.0], [9.0, 8.0, 8.0]]
    ready = [[1.0, 1.0, 2.0], [1.0, 3.0, 1.0], [1.0, 2.0, 2.0], [1.0, 1.0, 1.0]]
    p = rrfp.paired_speedup(strict, ready, measured)
    assert p.rounds == (2.0, 2.0, 1.0, 8.0)
    assert p.speedup == 2.0
    q1, q3 = 1.75, 3.5                                       # numpy's linear quartiles of 1, 2, 2, 8
    assert p.spread == pytest.approx((q3 - q1) / 2) and "interquartile" in p.spread_of


def test_one_round_keeps_the_per_iteration_mean_and_deviation():
    """A single launch pair (emulated points, or real_rounds = 1) is what it always was: mean and
    standard deviation of the per-iteration ratios."""
    p = rrfp.paired_speedup([[5.0, 2.0, 3.0, 6.0]], [[1.0, 1.0, 2.0, 2.0]], range(1, 4))
    ratios = [2.0, 1.5, 3.0]
    assert p.speedup == pytest.approx(np.mean(ratios)) and p.spread == pytest.approx(np.std(ratios, ddof=1))
    assert p.rounds == (pytest.approx(np.mean(ratios)),) and "deviation" in p.spread_of
    with pytest.raises(ValueError):
        rrfp.paired_speedup([[1.0, 1.0]], [[1.0, 1.0], [1.0, 1.0]], range(2))


def test_calibration_takes_i_and_w_at_the_1f1b_launchs_speed():
    """F and B come from the 1F1B launch; the ZB-H1 launch's I and W are scaled per stage by the
    F ratio of the two launches (the same F ran in both), so a slower ZB-H1 launch leaves them
    as they are against F and B."""
    one = {(0, 0): 2.0, (0, 3): 5.0, (1, 0): 3.0, (1, 3): 6.0}
    zb = {(0, 0): 4.0, (0, 1): 2.0, (0, 2): 4.0, (1, 0): 3.0, (1, 1): 4.0, (1, 2): 3.0}
    t = rrfp.calibration_times(one, zb)
    assert t == {(0, 0): 2.0, (0, 3): 5.0, (0, 1): 1.0, (0, 2): 2.0, (1, 0): 3.0, (1, 3): 6.0, (1, 1): 4.0,
                 (1, 2): 3.0}


def test_ab_launches_pair_each_strict_iteration_with_the_ready_first_one_after_it():
    """An A/B launch's even iterations are strict and odd ones ready-first on the same draw; the
    measured draws' ratios pool over the rounds (mean, standard deviation), and each round keeps
    its own mean. CPU: ready-first's iterations over strict's inside each launch, median."""
    def res(its, cpus):
        return SimpleNamespace(iteration_s=its, events=[[{"it": k, "cpu_s": c} for k, c in enumerate(cpus)]])
    a = res([9.0, 9.0, 4.0, 2.0, 3.0, 3.0], [1, 1, 1, 2, 1, 1])       # draw 0 is the warm-up
    b = res([9.0, 9.0, 6.0, 2.0, 2.0, 1.0], [1, 1, 2, 2, 1, 3])
    assert rrfp.ab_split(a) == ([9.0, 4.0, 3.0], [9.0, 2.0, 3.0])
    p = rrfp.ab_speedup([a, b], range(1, 3))
    ratios = [2.0, 1.0, 3.0, 2.0]
    assert p.speedup == pytest.approx(np.mean(ratios)) and p.spread == pytest.approx(np.std(ratios, ddof=1))
    assert p.rounds == (1.5, 2.5) and "within each launch" in p.spread_of
    assert rrfp.ab_cpu_ratio([a, b], range(1, 3)) == pytest.approx(np.median([1.5 / 1.0, 2.5 / 1.5]))
