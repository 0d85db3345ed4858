"""Idealized (unit-slot) tables against closed forms: where they agree, and where they do not."""
from __future__ import annotations

import numpy as np
import pytest
from hand_tables import one_f_one_b
from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

from octopipe.errors import ScheduleError
from octopipe.schedule.action import Action, B, F, I, W
from octopipe.schedule.idealized import SlotCosts, idealize
from octopipe.schedule.library import SCHEDULES, bubble_ratio, build_schedule, inflight_microbatches
from octopipe.schedule.table import ScheduleTable


def gpipe(p: int, m: int) -> ScheduleTable:
    rows = [[Action(d, F, i) for i in range(m)] + [Action(d, B, i) for i in range(m)] for d in range(p)]
    return ScheduleTable.from_rows(rows, range(p), m, "gpipe")


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
def test_torch_interleaved_matches_narayanan_form(p, m):
    """Narayanan et al.'s (p-1)/(v·m+p-1) holds for torch's interleaved 1F1B table whether B
    costs one slot or two (warm-up and drain scale with F+B like the steady state)."""
    t = torch_table("Interleaved1F1B", p, m, 2)
    for costs in ("unit", "1:1:1"):
        np.testing.assert_allclose(idealize(t, costs).idle_ratio, bubble_ratio("interleaved", p, m, chunks=2))


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


# ------------------------------------------------------------- every named schedule

SHAPES = [(p, m) for p in (2, 3, 4, 6) for m in (p, 2 * p, 12)]


def _chunks(t: ScheduleTable, name: str) -> int | None:
    return None if name == "chimera" else t.n_stages // t.n_devices


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved", "looped_bfs", "zbh1"])
def test_formula_equals_table_when_microbatches_fill_the_pipeline(name):
    """With m >= p and F:I:W = 1:1:1 these closed forms are exact for our tables."""
    for p, m in SHAPES:
        t = build_schedule(name, p, m)
        it = idealize(t, "1:1:1")
        np.testing.assert_allclose(it.idle_ratio, bubble_ratio(name, p, m, _chunks(t, name)), atol=1e-12)


@pytest.mark.parametrize("name", ["interleaved", "zbh1"])
def test_interleaved_forms_underestimate_with_fewer_microbatches_than_devices(name):
    """(p-1)/(v·m+p-1) assumes each round holds p micro-batches; with m < p the table waits for
    the round to come back (observed for every m < p tried)."""
    for p, m in [(3, 2), (4, 2), (4, 3), (6, 4)]:
        t = build_schedule(name, p, m)
        assert idealize(t, "1:1:1").bubble_ratio > bubble_ratio(name, p, m, _chunks(t, name)) + 0.01


@pytest.mark.parametrize("p", [4, 6, 8])
def test_chimera_formula_assumes_backward_costs_one_forward(p):
    """Li & Hoefler's (D-2)/(2N+D-2) is the unit-slot table exactly (p-2 idle slots per device);
    with B = 2F the same table idles 3(p-2) slots, so the formula underestimates it: at (8, 16)
    15.8% by formula, 27.3% in the table."""
    m = 2 * p
    t = build_schedule("chimera", p, m)
    unit, fb = idealize(t, "unit"), idealize(t, "1:1:1")
    np.testing.assert_allclose(unit.makespan - unit.busy, p - 2)
    np.testing.assert_allclose(unit.idle_ratio, bubble_ratio("chimera", p, m))
    np.testing.assert_allclose(fb.makespan - fb.busy, 3 * (p - 2))
    np.testing.assert_allclose(fb.idle_ratio, (p - 2) / (m + p - 2))
    assert fb.bubble_ratio > bubble_ratio("chimera", p, m) + 0.05


def test_hanayo_formula_holds_for_unit_slots_only():
    """The interleaving form used for Hanayo matches one slot per action; at B = 2F the waves'
    turns leave more idle slots (observed 17 per device at (4, 8), formula's 6 at unit cost)."""
    for p, m in [(2, 4), (4, 8), (4, 12)]:
        t = build_schedule("hanayo", p, m)
        np.testing.assert_allclose(idealize(t, "unit").idle_ratio, bubble_ratio("hanayo", p, m))
        assert idealize(t, "1:1:1").bubble_ratio > bubble_ratio("hanayo", p, m) + 0.05
    it = idealize(build_schedule("hanayo", 4, 8), "1:1:1")
    np.testing.assert_allclose(it.makespan - it.busy, 17)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (6, 12), (8, 16)])
def test_zero_bubble_forms_count_no_warm_up(p, m):
    """At F = I = W, ZB-H2 and ZB-V have a zero bubble by formula (the paper counts the steady
    state, the optimizer step's post-validation removing the rest); the strict-order table keeps
    the warm-up: p-1 idle slots per device for ZB-H2 (its parallelogram) and ZB-V. DualPipeV's
    form with no F&B overlap gain, (p-1)(F+2I-W) = 2(p-1), overestimates its table's p-1 idle
    slots."""
    for name, idle in [("zbh2", p - 1), ("zbv", p - 1), ("dualpipev", p - 1)]:
        it = idealize(build_schedule(name, p, m), "1:1:1")
        np.testing.assert_allclose(it.makespan - it.busy, idle)
    assert bubble_ratio("zbh2", p, m) == bubble_ratio("zbv", p, m) == 0.0
    dual = idealize(build_schedule("dualpipev", p, m), "1:1:1")
    np.testing.assert_allclose(bubble_ratio("dualpipev", p, m), 2 * (p - 1) / (6 * m + 2 * (p - 1)))
    assert dual.bubble_ratio < bubble_ratio("dualpipev", p, m)


def test_pipedream_table_is_one_flushed_iteration():
    """PipeDream's formula is the asynchronous steady state (no flush, bubble 0); its table is a
    single iteration, which idles exactly as 1F1B."""
    for p, m in [(2, 4), (4, 8)]:
        it = idealize(build_schedule("pipedream", p, m), "1:1:1")
        assert bubble_ratio("pipedream", p, m) == 0.0
        np.testing.assert_allclose(it.idle_ratio, bubble_ratio("1f1b", p, m))


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_peak_inflight_matches_formula_for_every_schedule(name):
    """Peak live activations per device in the slot table equal the closed forms."""
    for p in (1, 2, 3, 4, 6):
        for m in (1, 2, 3, 5, 8, 12):
            try:
                t = build_schedule(name, p, m)
            except ScheduleError:
                continue  # shapes the schedule refuses (tested by the generators' owner)
            it = idealize(t, "1:1:1")
            expected = [inflight_microbatches(name, p, d, m, _chunks(t, name)) for d in range(p)]
            assert list(it.peak_inflight()) == expected, (p, m)
