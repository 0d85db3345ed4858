"""The logistic-regime study's pieces: the paper's budget, the stream-length search, the noisy
objective, and the equal-tick comparison on a small case."""
import numpy as np

from octopipe.asynchronous.regime import (
    NoisyGradients,
    compare_at_budget,
    largest_m,
    paper_budget_ticks,
    paper_logistic,
)
from octopipe.asynchronous.tables import async_schedule, localsgd_rows


def test_paper_budget_is_six_pd_timelines_of_s8_m300():
    # PD's stream at unit ticks: 2M + 2(S - 1) ticks
    assert paper_budget_ticks() == 6 * (2 * 300 + 2 * 7) == 3684


def test_largest_m_is_the_longest_stream_in_the_budget():
    span = lambda m: async_schedule("pd", 4, m).n_ticks
    m = largest_m(span, 100, 4)
    assert span(m) <= 100 < span(m + 1)
    loc = lambda m: max(len(r) for r in localsgd_rows(4, m, 4, 5))
    k = largest_m(loc, 100, 4)
    assert loc(k) <= 100 < loc(k + 1) and k < m       # LocalSGD's barriers: fewer in the same time


def test_noise_is_seeded_and_zero_noise_is_the_exact_gradient():
    o = paper_logistic(2, n_batches=4, d=8)
    w = np.full(8, 0.1)
    assert np.array_equal(NoisyGradients(o.base, 0.0).grad(w, 1), o.base.grad(w, 1))
    a, b = o.fresh().grad(w, 1), o.fresh().grad(w, 1)
    assert np.array_equal(a, b) and not np.allclose(a, o.base.grad(w, 1))


def test_equal_tick_comparison_keeps_each_methods_best_step():
    o = paper_logistic(2, n_batches=6, d=16)
    res = compare_at_budget(o, 2, 80, (0.01, 0.1), (0.01, 0.1), 2)
    assert set(res) == {"pd", "localsgd_H2"}
    assert res["pd"].microbatches == largest_m(lambda m: async_schedule("pd", 2, m).n_ticks, 80, 2)
    assert res["localsgd_H2"].microbatches < res["pd"].microbatches
    assert all(r.lr in (0.01, 0.1) and np.isfinite(r.gap) and r.gap > -1e-9 for r in res.values())
