"""Closed-form bubble ratios and in-flight counts (octopipe.schedule.formulas)."""
from __future__ import annotations

import pytest

from octopipe.errors import ScheduleError
from octopipe.schedule.action import B, F, W
from octopipe.schedule.generators._common import align_lockstep
from octopipe.schedule.library import FORMULA_SCHEDULES, SCHEDULES, bubble_ratio, build_schedule, inflight_microbatches


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


# ------------------------------------------------------------------ formula against the tables



def peak_inflight_by_walking(table) -> list[int]:
    """Per device: live activations rise at every F and fall at the B (or W) that frees them."""
    peaks = []
    for d in range(table.n_devices):
        live = peak = 0
        for a in table.actions(d):
            live += 1 if a.kind is F else -1 if a.kind in (B, W) else 0
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_inflight_formula_equals_the_peak_of_every_generated_table(name):
    checked = 0
    for p in (1, 2, 3, 4, 5, 8):
        for m in (1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17):
            for v in (1, 2, 3, 4):
                try:
                    t = build_schedule(name, p, m, v)
                except ScheduleError:
                    continue
                walked = peak_inflight_by_walking(t)
                assert walked == [inflight_microbatches(name, p, d, m, v) for d in range(p)], (p, m, v)
                checked += 1
    assert checked >= 10


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 2), (3, 5), (4, 4), (4, 8), (8, 16)])
def test_unit_slot_idle_ratio_of_gpipe_and_1f1b_is_the_closed_form(name, p, m):
    # Every compute action one slot, devices run their rows in order as soon as inputs exist.
    t = build_schedule(name, p, m).compact()
    aligned = align_lockstep(t.rows, t.n_stages)
    makespan = max(len(r) for r in aligned)
    busy = sum(len(r) for r in t.rows)
    assert 1 - busy / (p * makespan) == pytest.approx(bubble_ratio(name, p, m))


def test_formulas_refuse_chunk_counts_the_schedule_cannot_build():
    with pytest.raises(ScheduleError, match="zbv needs chunks = 2"):
        inflight_microbatches("zbv", 4, 0, 8, chunks=3)
    with pytest.raises(ScheduleError, match="even number of chunks"):
        bubble_ratio("hanayo", 4, 8, chunks=3)
    for name, info in SCHEDULES.items():  # chunks=None is the registry's natural count
        assert inflight_microbatches(name, 4, 0, 8) == inflight_microbatches(
            name, 4, 0, 8, chunks=info.default_chunks)
