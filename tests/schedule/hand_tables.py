"""Hand-written reference tables shared by the schedule tests (independent of the generators)."""
from __future__ import annotations

from octopipe.schedule.action import Action, B, F, I, W
from octopipe.schedule.table import ScheduleTable


def one_f_one_b(p: int, m: int, split: bool = False) -> ScheduleTable:
    """1F1B written out by hand: p−1−d warm-up forwards, then alternate; `split` uses I then W."""
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
