"""Validation: each class of mistake gets its sentence and its marked cell; random valid tables
pass and random corruptions are caught (hypothesis)."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from octopipe.errors import ScheduleError
from octopipe.schedule.action import Action, B, F, I, W
from octopipe.schedule.table import ScheduleTable
from octopipe.schedule.validate import data_predecessors, is_valid, validate

GOOD = [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]


def table(rows, placement=(0, 1), m=2) -> ScheduleTable:
    return ScheduleTable.from_strings(rows, placement, m)


def test_good_table_passes():
    validate(table(GOOD))
    assert is_valid(table(GOOD))


@pytest.mark.parametrize("rows,placement,m,sentence,mark", [
    # missing
    ([["0F0", "0F1", "0B0"], ["1F0", "1B0", "1F1", "1B1"]], (0, 1), 2,
     "backward of stage 0 micro-batch 1 is missing (neither 0B1 nor 0I1/0W1; its forward 0F1 is "
     "marked)", (0, 1)),
    ([["0F0", "0F1", "0B0", "0B1"], ["1B0", "1F1", "1B1"]], (0, 1), 2,
     "1F0 is missing: every stage runs F once per micro-batch (1B0 needs it; marked)", (1, 0)),
    ([["0F0", "0B0"], ["1B0"]], (0, 1), 1,
     "1F0 is missing: every stage runs F once per micro-batch (1B0 needs it; marked)", (1, 0)),
    ([["0B0"], ["1F0", "1B0"]], (0, 1), 1,
     "0F0 is missing: every stage runs F once per micro-batch (0B0 needs it; marked)", (0, 0)),
    ([[], ["1F0", "1B0"]], (0, 1), 1,
     "0F0 is missing: every stage runs F once per micro-batch (1F0 needs it; marked)", (1, 0)),
    ([["0F0", "0B0"], []], (0, 1), 1,
     "1F0 is missing: every stage runs F once per micro-batch", None),
    # duplicated
    ([["0F0", "0F1", "0B0", "0B1", "0B1"], ["1F0", "1B0", "1F1", "1B1"]], (0, 1), 2,
     "0B1 appears twice (first at device 0, column 3)", (0, 4)),
    # out of range
    ([["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F2", "1B1"]], (0, 1), 2,
     "1F2 names micro-batch 2, outside 0..1", (1, 2)),
    ([["0F0", "0F1", "0B0", "0B1"], ["2F0", "1B0", "1F1", "1B1"]], (0, 1), 2,
     "2F0 names stage 2, outside 0..1", (1, 0)),
    # wrong device
    ([["0F0", "0F1", "0B0", "0B1", "1F0"], ["1B0", "1F1", "1B1"]], (0, 1), 2,
     "1F0 is on device 0 but stage 1 of micro-batch 0 is placed on device 1", (0, 4)),
    # I without W, W without I, B with I
    ([["0F0", "0F1", "0B0", "0B1"], ["1F0", "1I0", "1F1", "1B1"]], (0, 1), 2,
     "1I0 has no matching 1W0: a split backward needs both I and W", (1, 1)),
    ([["0F0", "0F1", "0B0", "0B1"], ["1F0", "1W0", "1F1", "1B1"]], (0, 1), 2,
     "1W0 has no matching 1I0: a split backward needs both I and W", (1, 1)),
    ([["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1I0", "1F1", "1B1"]], (0, 1), 2,
     "1B0 is a full backward but 1I0 also appears; use either B or the pair I, W", (1, 1)),
    # W before I
    ([["0F0", "0F1", "0B0", "0B1"], ["1F0", "1W0", "1I0", "1F1", "1B1"]], (0, 1), 2,
     "1W0 comes before 1I0 on device 1: W before its I (1W0 needs 1I0 first)", (1, 1)),
    # order against data dependencies on one device
    ([["0F0", "0B0", "0F1", "0B1"], ["1F0", "1B0", "1F1", "1B1"]], (0, 1), 2,
     None, None),
    ([["0F0", "0F1", "0B1", "0B0"], ["1F0", "1F1", "1B0", "1B1"]], (0, 1), 2,
     None, None),
    ([["0F0", "1F0", "0B0", "1B0"]], (0, 0), 1,
     "0B0 comes before 1B0 on device 0: an order that contradicts its data dependencies "
     "(0B0 needs 1B0 first)", (0, 2)),
    # a cycle across devices
    ([["0F0", "0B0", "0F1", "0B1"], ["1F1", "1F0", "1B0", "1B1"]], (0, 1), 2,
     "the table can never run: 1F1 waits in a cycle of device orders and data dependencies", (1, 0)),
    # communication actions belong to lowered tables
    ([["0F0", "0SEND_F0", "0B0"], ["1F0", "1B0"]], (0, 1), 1,
     "0SEND_F0 is a communication action; validate() takes compute-only tables", (0, 1)),
])
def test_each_mistake_has_its_sentence_and_marker(rows, placement, m, sentence, mark):
    t = table(rows, placement, m)
    if sentence is None:  # valid orders that look odd: 1F1B's early backward, reversed backwards
        validate(t)
        return
    with pytest.raises(ScheduleError) as e:
        validate(t)
    msg = str(e.value)
    assert msg.splitlines()[0].startswith(sentence)
    grid = msg.splitlines()[1:]
    marked = [(d, ln) for d, ln in enumerate(grid[1:len(t.rows) + 1]) if ">" in ln]
    if mark is None:
        assert marked == []
    else:
        d, c = mark
        if "cycle" in sentence:     # every cell of the cycle is marked, the named one among them
            assert d in [r for r, _ in marked] and f">{rows[d][c]}<" in dict(marked)[d]
            return
        assert [d for d, _ in marked] == [d]
        assert f">{rows[d][c]}<" in marked[0][1]


# ------------------------------------------------------------------- property tests

@st.composite
def valid_tables(draw):
    """Any placement, any mix of B and I/W, rows taken from one random topological order."""
    p = draw(st.integers(1, 4))
    n_s = draw(st.integers(1, 5))
    m = draw(st.integers(1, 4))
    placement = draw(st.lists(st.integers(0, p - 1), min_size=n_s, max_size=n_s))
    split = {(s, k) for s in range(n_s) for k in range(m) if draw(st.booleans())}
    rng = random.Random(draw(st.integers(0, 2**31)))
    acts = [Action(s, F, k) for s in range(n_s) for k in range(m)]
    acts += [Action(s, x, k) for s in range(n_s) for k in range(m)
             for x in ((I, W) if (s, k) in split else (B,))]
    done: set[Action] = set()
    rows: list[list[Action]] = [[] for _ in range(p)]
    while len(done) < len(acts):
        ready = [a for a in acts if a not in done and all(q in done for q in data_predecessors(a, n_s, split))]
        a = rng.choice(ready)
        done.add(a)
        rows[placement[a.stage]].append(a)
    return ScheduleTable.from_rows(rows, placement, m), rng


@settings(max_examples=60, deadline=None)
@given(valid_tables())
def test_random_valid_tables_pass(case):
    t, _ = case
    validate(t)


def _corrupt(t: ScheduleTable, rng: random.Random) -> tuple[str, ScheduleTable]:
    rows = [list(r) for r in t.rows]
    cells = [(d, c) for d, r in enumerate(rows) for c in range(len(r))]
    d, c = rng.choice(cells)
    a = rows[d][c]
    how = rng.choice(["drop", "duplicate", "microbatch", "device", "reorder", "retype"])
    if how == "drop":
        del rows[d][c]
    elif how == "duplicate":
        rows[rng.randrange(len(rows))].insert(rng.randrange(len(rows[d]) + 1), a)
    elif how == "microbatch":
        rows[d][c] = Action(a.stage, a.kind, t.n_microbatches + rng.randrange(3))
    elif how == "device":
        if t.n_devices == 1:
            del rows[d][c]
            return "drop", t.with_rows(rows)
        other = rng.choice([x for x in range(t.n_devices) if x != t.placement[a.stage]])
        del rows[d][c]
        rows[other].insert(rng.randrange(len(rows[other]) + 1), a)
    elif how == "reorder":
        # put F of this (stage, micro-batch) after its own backward (always on the same device)
        f = Action(a.stage, F, a.microbatch)
        rows[d].remove(f)
        rows[d].append(f)
    else:  # retype: a B becomes I (no W), an I or W becomes B (a B beside its partner), F → W
        new = {F: W, B: I, I: B, W: B}[a.kind]
        rows[d][c] = Action(a.stage, new, a.microbatch)
    return how, t.with_rows(rows)


@settings(max_examples=120, deadline=None)
@given(valid_tables())
def test_random_corruptions_are_caught(case):
    t, rng = case
    how, bad = _corrupt(t, rng)
    with pytest.raises(ScheduleError) as e:
        validate(bad)
    first = str(e.value).splitlines()[0]
    assert any(phrase in first for phrase in EXPECTED[how]), (how, first)


EXPECTED = {
    "drop": ("is missing", "has no matching"),
    "duplicate": ("appears twice", "is on device"),
    "microbatch": ("outside 0..",),
    "device": ("is on device",),
    "reorder": ("comes before",),
    "retype": ("is missing", "has no matching", "is a full backward but", "appears twice"),
}
