"""Our generators against torch.distributed.pipelining's own tables (built without a process group).

For each schedule torch also builds, compare per-device compute order (idle cells dropped) and,
where both tables are time-aligned, the positions. Every remaining difference is asserted here
exactly, with the reason.
"""
from __future__ import annotations

import logging

import pytest

pytest.importorskip("torch.distributed.pipelining")

from unittest import mock

from torch.distributed.pipelining import schedules as ts
from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
from torch.distributed.pipelining.stage import PipelineStage

from octopipe.schedule.action import Action, ActionKind, F, I
from octopipe.schedule.library import build_schedule

DEVICES = (1, 2, 3, 4, 5, 8)
MICROBATCHES = (1, 2, 3, 4, 5, 6, 9, 10, 16)

Cells = list[list[str | None]]


@pytest.fixture(autouse=True)
def _quiet_torch():
    logging.disable(logging.WARNING)  # torch logs every bubble it adds to ZB1P
    yield
    logging.disable(logging.NOTSET)


def _cells(torch_rows) -> Cells:
    """torch actions as strings: REDUCE_GRAD dropped, OVERLAP_F_B expanded into its F then B."""
    out: Cells = []
    for row in torch_rows:
        cells: list[str | None] = []
        for a in row:
            if a is None:
                cells.append(None)
            elif a.computation_type == ts.OVERLAP_F_B:
                cells += [str(sub) for sub in a.sub_actions]
            elif a.computation_type != ts.REDUCE_GRAD:
                cells.append(str(a))
        out.append(cells)
    return out


def torch_table(schedule: str, p: int, m: int, chunks: int) -> Cells | None:
    """torch's table, or None where torch refuses the shape."""
    try:
        if chunks == 1 and schedule == "InterleavedZeroBubble":
            # get_schedule_ops insists on >= 2 stages per rank for multi-stage classes; the
            # class itself builds ZB1P with one stage per rank (ZB-H1), so mock it directly.
            stage = mock.create_autospec(PipelineStage, instance=True)
            stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, p, None, p
            order = ts.ScheduleInterleavedZeroBubble([stage], m).pipeline_order
            return _cells([order[r] for r in range(p)])
        return _cells(get_schedule_ops(schedule, p, m, chunks))
    except (ValueError, AssertionError):
        return None


def ours(name: str, p: int, m: int, chunks: int) -> Cells:
    return [[c or None for c in row] for row in build_schedule(name, p, m, chunks).as_strings()]


def order(cells: Cells) -> list[list[str]]:
    return [[c for c in row if c] for row in cells]


def _grid(schedule: str, chunk_values):
    for p in DEVICES:
        for m in MICROBATCHES:
            for v in chunk_values:
                theirs = torch_table(schedule, p, m, v)
                if theirs is not None:
                    yield p, m, v, theirs


@pytest.mark.parametrize("name,schedule,chunk_values", [
    ("gpipe", "GPipe", (1,)),
    ("interleaved", "Interleaved1F1B", (2, 3)),
    ("looped_bfs", "LoopedBFS", (2, 3)),
    ("zbv", "ZBVZeroBubble", (2,)),
])
def test_identical_tables_including_idle_cells(name, schedule, chunk_values):
    compared = 0
    for p, m, v, theirs in _grid(schedule, chunk_values):
        assert ours(name, p, m, v) == theirs, (name, p, m, v)
        compared += 1
    assert compared >= 50


def test_dualpipev_matches_torch_once_overlap_composites_are_expanded():
    # torch emits (F;B)OVERLAP_F_B composites; expanded as F then B they are our order. Neither
    # table has idle cells, so the expanded tables are identical cell by cell.
    compared = 0
    for p, m, v, theirs in _grid("DualPipeV", (2,)):
        assert ours("dualpipev", p, m, v) == theirs, (p, m)
        compared += 1
    assert compared >= 20


def test_interleaved_refusals_are_exactly_torchs_divisibility_rule():
    # torch refuses m not divisible by max(1, m // p); we accept those (see test_generators).
    for p in (2, 3, 4):
        for m in range(1, 17):
            refused = torch_table("Interleaved1F1B", p, m, 2) is None
            assert refused == (m % max(1, m // p) != 0), (p, m)


def _unit_time_violations(cells: Cells, n_stages: int) -> list[str]:
    """I cells sitting at or before the column of the I (or B) of the next stage they consume."""
    column = {c: col for row in cells for col, c in enumerate(row) if c}
    bad = []
    for c, col in column.items():
        a = Action.parse(c)
        if a.kind is I and a.stage + 1 < n_stages:
            producer = next(str(Action(a.stage + 1, k, a.microbatch)) for k in (I, ActionKind.B)
                            if str(Action(a.stage + 1, k, a.microbatch)) in column)
            if column[producer] >= col:
                bad.append(c)
    return bad


def test_zbh1_matches_torch_interleaved_zero_bubble():
    """Same order everywhere; positions differ only where torch's bubble pass misplaces an I.

    torch's `_add_bubbles_to_actions` checks the cross-stage dependency of F and B only, never of
    I, so some I cells of its ZB1P table sit at or before the column of the I they consume. Our
    alignment applies the full rule. Where torch's table has no such cell, positions agree too.
    """
    compared = differing = 0
    for p, m, v, theirs in _grid("InterleavedZeroBubble", (1, 2, 3)):
        mine = ours("zbh1", p, m, v)
        assert order(mine) == order(theirs), (p, m, v)
        assert _unit_time_violations(mine, p * v) == []
        if mine != theirs:
            differing += 1
            assert _unit_time_violations(theirs, p * v), (p, m, v)
        compared += 1
    assert compared >= 100 and 0 < differing < compared


def test_1f1b_matches_torch_except_torchs_off_by_one_on_the_last_rank():
    """torch's Schedule1F1B._get_pipeline_order (visualization only) starts the last rank's
    forwards at micro-batch 1: with no warm-up its counter is incremented before first use, so
    the last row reads F1..Fm (Fm is out of range) where ours reads F0..F(m-1). Every other row
    is identical."""
    compared = 0
    for p, m, _v, theirs in _grid("1F1B", (1,)):
        mine = order(ours("1f1b", p, m, 1))
        theirs = order(theirs)
        assert mine[:-1] == theirs[:-1], (p, m)
        shifted = [str(Action(a.stage, a.kind, a.microbatch + (a.kind is F)))
                   for a in map(Action.parse, mine[-1])]
        assert theirs[-1] == shifted, (p, m)
        compared += 1
    assert compared >= 30
