"""Plain-text grid of a table, with an optional marked cell, for error messages and logs."""
from __future__ import annotations

from collections.abc import Collection

from octopipe.schedule.table import ScheduleTable

Cell = tuple[int, int]


def format_grid(table: ScheduleTable, mark: Cell | Collection[Cell] | None = None, max_cols: int = 48) -> str:
    """Rows are devices, columns are row positions; `mark=(device, column)` (or several such
    cells: a cycle) is wrapped in >…<."""
    marks = set() if mark is None else {mark} if isinstance(mark[0], int) else set(mark)
    mark = min(marks, key=lambda dc: (dc[1], dc[0])) if marks else None
    cells = table.as_strings()
    width = max([len(c) for r in cells for c in r] + [2]) + 2
    lo = 0
    longest = max((len(r) for r in cells), default=0)
    if longest > max_cols:
        centre = mark[1] if mark else 0
        lo = max(0, min(centre - max_cols // 2, longest - max_cols))
    hi = lo + max_cols
    lines = [f"{'':>8}" + "".join(f"{c:^{width}}" for c in range(lo, min(hi, longest)))]
    for d, row in enumerate(cells):
        parts = []
        for c in range(lo, min(hi, longest)):
            text = row[c] if c < len(row) else ""
            text = text or "."
            if (d, c) in marks:
                text = f">{text}<"
            parts.append(f"{text:^{width}}")
        lines.append(f"dev {d:>3} " + "".join(parts))
    if lo > 0 or hi < longest:
        lines.append(f"(columns {lo}..{min(hi, longest) - 1} of {longest})")
    return "\n".join(lines)
