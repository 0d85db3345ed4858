"""Closed-form bubble ratios and in-flight counts (octopipe.schedule.formulas)."""
from __future__ import annotations

import pytest

from octopipe.errors import ScheduleError
from octopipe.schedule.formulas import FORMULA_SCHEDULES, bubble_ratio, inflight_microbatches


@pytest.mark.parametrize("p,m", [(2, 2), (4, 8), (8, 16), (8, 64)])
def test_gpipe_and_1f1b_share_the_fill_drain_bubble(p, m):
    expected = (p - 1) / (m + p - 1)
    assert bubble_ratio("gpipe", p, m) == pytest.approx(expected)
    assert bubble_ratio("1f1b", p, m) == pytest.approx(expected)


def test_interleaving_divides_the_bubble_by_the_chunk_count():
    assert bubble_ratio("interleaved", 4, 8, chunks=2) == pytest.approx(3 / 19)
    assert bubble_ratio("interleaved", 4, 8, chunks=1) == pytest.approx(bubble_ratio("1f1b", 4, 8))


def test_chimera_matches_the_published_point():
    # Barley et al. 2026: (S, B) = (8, 16) gives 6/38 ≈ 15.8 % by formula.
    assert bubble_ratio("chimera", 8, 16) == pytest.approx(6 / 38)


def test_zero_bubble_schedules_vanish_at_equal_costs_but_not_otherwise():
    assert bubble_ratio("zbh2", 4, 8) == 0.0
    assert bubble_ratio("zbv", 4, 8) == 0.0
    assert bubble_ratio("zbh1", 4, 8) == pytest.approx(3 / (24 + 3))
    assert bubble_ratio("zbh2", 4, 8, costs=(1.0, 2.0, 1.0)) > 0.0


def test_1f1b_inflight_falls_with_depth_and_gpipe_holds_everything():
    assert [inflight_microbatches("1f1b", 4, d, 8) for d in range(4)] == [4, 3, 2, 1]
    assert [inflight_microbatches("gpipe", 4, d, 8) for d in range(4)] == [8] * 4
    # Megatron's interleaving factor 1 + (p-1)/(p·v) on the first device, in chunk units.
    p, v = 4, 2
    assert inflight_microbatches("interleaved", p, 0, 8, chunks=v) / v == pytest.approx(
        p * (1 + (p - 1) / (p * v)))


def test_every_named_schedule_has_both_formulas():
    for name in FORMULA_SCHEDULES:
        assert 0.0 <= bubble_ratio(name, 4, 8) < 1.0
        assert inflight_microbatches(name, 4, 0, 8) >= 1


def test_bad_requests_raise_schedule_error():
    with pytest.raises(ScheduleError, match="known"):
        bubble_ratio("nope", 4, 8)
    with pytest.raises(ScheduleError, match="device 4"):
        inflight_microbatches("1f1b", 4, 4, 8)
