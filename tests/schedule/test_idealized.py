"""Idealized (unit-slot) tables against closed forms: where they agree, and where they do not."""
from __future__ import annotations

import numpy as np
import pytest
from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

from octopipe.errors import ScheduleError
from octopipe.schedule.action import Action, B, F, I, W
from octopipe.schedule.formulas import bubble_ratio, inflight_microbatches
from octopipe.schedule.idealized import SlotCosts, idealize
from octopipe.schedule.table import ScheduleTable


def gpipe(p: int, m: int) -> ScheduleTable:
    rows = [[Action(d, F, i) for i in range(m)] + [Action(d, B, i) for i in range(m)] for d in range(p)]
    return ScheduleTable.from_rows(rows, range(p), m, "gpipe")


def one_f_one_b(p: int, m: int, split: bool = False) -> ScheduleTable:
    rows = []
    for d in range(p):
        warm = min(p - 1 - d, m)
        row = [Action(d, F, i) for i in range(warm)]
        for b in range(m):
            if warm + b < m:
                row.append(Action(d, F, warm + b))
            row += [Action(d, I, b), Action(d, W, b)] if split else [Action(d, B, b)]
        rows.append(row)
    return ScheduleTable.from_rows(rows, range(p), m, "1f1b")


def torch_table(name: str, p: int, m: int, chunks: int | None) -> ScheduleTable:
    rows = [[Action.parse(str(x)) for a in r if a is not None for x in (a.sub_actions or (a,))
             if x.microbatch_index is not None] for r in get_schedule_ops(name, p, m, chunks)]
    stage_dev = {a.stage: d for d, r in enumerate(rows) for a in r}
    return ScheduleTable.from_rows(rows, [stage_dev[s] for s in range(len(stage_dev))], m, name)


@pytest.mark.parametrize("p,m", [(2, 1), (3, 5), (4, 4), (4, 8), (6, 3), (8, 16)])
@pytest.mark.parametrize("build,name", [(gpipe, "gpipe"), (one_f_one_b, "1f1b")])
def test_gpipe_and_1f1b_match_the_closed_form_at_f1_b2(build, name, p, m):
    """F=1, B=2 (ratio 1:1:1, B = I+W): every device idles (p-1)/(m+p-1), as the formula says."""
    it = idealize(build(p, m), "1:1:1")
    assert it.makespan == 3 * (m + p - 1)
    np.testing.assert_allclose(it.idle_ratio, (p - 1) / (m + p - 1))
    assert it.bubble_ratio == pytest.approx(bubble_ratio(name, p, m, costs=(1, 1, 1)))


@pytest.mark.parametrize("p,m", [(3, 5), (4, 8), (5, 2)])
def test_peak_inflight_matches_formula_for_gpipe_and_1f1b(p, m):
    for build, name in [(gpipe, "gpipe"), (one_f_one_b, "1f1b")]:
        it = idealize(build(p, m), "1:1:1")
        assert list(it.peak_inflight()) == [inflight_microbatches(name, p, d, m) for d in range(p)]


def test_unit_slots_and_ratio_1_2_1():
    t = one_f_one_b(2, 2)
    unit = idealize(t)
    assert unit.makespan == 6  # 0F0 0F1 . 0B0 . 0B1 on device 0 with B one slot
    assert unit.span(Action(1, B, 0)) == (2.0, 3.0)
    r = idealize(t, "1:2:1")  # F=1, B=I+W=3
    assert r.span(Action(0, B, 0)) == (5.0, 8.0)
    assert r.makespan == 4 * (2 + 2 - 1)  # (F+B)(m+p-1)


def test_split_backward_lifetime_ends_at_w():
    it = idealize(one_f_one_b(2, 2, split=True), "1:1:1")
    i0, w0 = it.span(Action(0, I, 0)), it.span(Action(0, W, 0))
    assert it.lifetime(0, 0) == (0.0, w0[1])
    assert i0[1] == w0[0]


def test_split_1f1b_is_not_zero_bubble():
    """Splitting B into I then W right after it only shortens the backward chain (I instead of
    I+W per hop): the fill/drain costs (p-1)(F+I) per device. ZB-H1's formula (p-1)(F+I-W)
    credits W passes moved into the bubbles, which this table does not do."""
    p, m = 4, 8
    it = idealize(one_f_one_b(p, m, split=True), "1:1:1")
    observed = (p - 1) * 2 / (m * 3 + (p - 1) * 2)
    np.testing.assert_allclose(it.idle_ratio, observed)
    assert bubble_ratio("zbh1", p, m) < observed


@pytest.mark.parametrize("p,m", [(4, 8), (4, 12)])
def test_torch_zbv_table_idles_a_little_where_the_formula_says_zero(p, m):
    """ZB-V at F=I=W: the formula (p-1)(F+I-2W) gives 0; torch's ZBV table fills most of the
    fill/drain with W but the first chunk-1 F still waits for the V to turn, so some idle slots
    remain (observed 3 slots per device at p=4, i.e. 3/51 at m=8)."""
    it = idealize(torch_table("ZBVZeroBubble", p, m, 2), "1:1:1")
    assert bubble_ratio("zbv", p, m) == 0.0
    work = 2 * m * 3
    assert it.makespan == work + 3
    np.testing.assert_allclose(it.idle_ratio, 3 / (work + 3))
    assert list(it.peak_inflight()) == [inflight_microbatches("zbv", p, d, m) for d in range(p)]


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 12)])
def test_torch_interleaved_matches_narayanan_form_with_unit_slots(p, m):
    """Narayanan et al.'s (p-1)/(v·m+p-1) holds for interleaved 1F1B when F and B each cost one
    slot... with B = 2F the drain costs more and the table idles more than the formula."""
    t = torch_table("Interleaved1F1B", p, m, 2)
    unit = idealize(t, "unit")
    np.testing.assert_allclose(unit.idle_ratio, bubble_ratio("interleaved", p, m, chunks=2))
    fb = idealize(t, "1:1:1")
    assert fb.bubble_ratio > bubble_ratio("interleaved", p, m, chunks=2)


def test_slot_grid_is_time_aligned():
    it = idealize(gpipe(2, 2), "1:1:1")
    g = it.slot_grid()
    assert [str(a) if a else "" for a in g.rows[1]] == ["", "1F0", "1F1", "1B0", "", "1B1", "", "", ""]
    assert g.compact() == gpipe(2, 2).compact()


def test_bad_costs_and_tables_are_refused():
    with pytest.raises(ScheduleError, match="slot ratio '1:2' must be 'unit' or three numbers"):
        SlotCosts.parse("1:2")
    with pytest.raises(ScheduleError, match="slot cost f=0 must be positive"):
        SlotCosts(0, 1, 1)
    bad = ScheduleTable.from_strings([["0F0", "0B0"], ["1B0", "1F0"]], (0, 1), 1)
    with pytest.raises(ScheduleError, match="1B0 comes before 1F0"):
        idealize(bad)


def test_lowered_tables_are_timed_by_their_compute():
    from octopipe.schedule.lower import lower

    t = one_f_one_b(3, 4)
    assert idealize(lower(t), "1:1:1").makespan == idealize(t, "1:1:1").makespan
