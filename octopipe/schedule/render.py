"""Pictures of schedules: a coloured terminal grid, and timed bars as a Chrome/Perfetto trace.

Colours come from `octopipe.schedule.palette`, the same in every picture; the one Gantt
renderer is the device timeline (`octopipe.schedule.timeline`), the one trace builder
`octopipe.report.trace`.

- `bars_trace(bars, unit_us)` returns the trace of `bars`, an iterable of `Bar(label, kind,
  start, end, text)` (plain tuples of 4 or 5 items work too): a thread per label, a complete
  event per bar with its kind as category; `unit_us` is the length of one time unit in
  microseconds (1e6 for seconds; `IDEALIZED_SLOT_US` for idealized slots, shown as ms).

For an `IdealizedTable`: `idealized_bars(it)` (bars per action), `idealized_timeline(it)` (the
device timeline), `idealized_timeline_png` and `idealized_trace`.
"""
from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from rich.console import Console
from rich.table import Table
from rich.text import Text

from octopipe.errors import ScheduleError
from octopipe.report.trace import TraceBuilder, write_trace
from octopipe.schedule import palette
from octopipe.schedule.action import Action, ActionKind
from octopipe.schedule.idealized import IdealizedTable
from octopipe.schedule.palette import kind_colour
from octopipe.schedule.table import ScheduleTable
from octopipe.schedule.timeline import Timeline, save_timeline_png, timeline

IDEALIZED_SLOT_US = 1000.0

class Bar(NamedTuple):
    """One timed bar: lane label, colour key, start and end (same unit), text inside."""

    label: str
    kind: str
    start: float
    end: float
    text: str = ""


def _cell(a: Action | None, chunk: int, letters: bool) -> Text:
    if a is None:
        return Text(" · ", style="dim")
    if a.kind.is_comm:
        arrow = "›" if a.kind.value.startswith("SEND") else "‹"
        tag = a.kind.value[-1] if letters else ""
        return Text(f"{arrow}{tag}{a.microbatch}", style=palette.KINDS[a.kind.value].terminal)
    colours = palette.KINDS[a.kind.value]
    style = colours.terminal_chunk if chunk % 2 == 1 else colours.terminal
    text = f"{a.kind.value}{a.microbatch}" if letters else str(a.microbatch)
    return Text(f"{text:^3}", style=style)


def _grid_rows(table: ScheduleTable, slots: IdealizedTable | None) -> list[list[Action | None]]:
    if slots is None:
        return [list(r) for r in table.rows]
    length = int(round(slots.makespan))
    rows: list[list[Action | None]] = [[None] * length for _ in range(slots.n_devices)]
    for k, a in enumerate(slots.actions):
        for t in range(int(round(slots.start[k])), int(round(slots.end[k]))):
            rows[int(slots.device[k])][t] = a
    return rows


def grid_renderable(table: ScheduleTable, slots: IdealizedTable | None = None, lo: int = 0,
                    hi: int | None = None, letters: bool = False) -> Table:
    """A rich table of columns `lo..hi-1`: a row per device, a cell per action (or per unit slot
    if `slots` is given), coloured by kind with the micro-batch number inside; a device's second
    chunk is darker. `letters` prefixes the kind (``F3``) for output without colour."""
    rows = _grid_rows(table, slots)
    chunk_of = {}
    for d in range(table.n_devices):
        local = sorted({s for _, s in table.replica_stages_of(d)})
        chunk_of.update({(d, s): c for c, s in enumerate(local)})
    longest = max((len(r) for r in rows), default=0)
    hi = longest if hi is None else min(hi, longest)
    grid = Table(show_header=True, header_style="dim", box=None, pad_edge=False, padding=(0, 0))
    grid.add_column("", justify="right", no_wrap=True, min_width=7)
    for c in range(lo, hi):
        grid.add_column(str(c) if c % 5 == 0 else "", justify="center", no_wrap=True,
                        min_width=4 if letters else 3)
    for d, row in enumerate(rows):
        cells = [_cell(row[c], chunk_of.get((d, row[c].stage), 0) if row[c] else 0, letters)
                 if c < len(row) else Text("") for c in range(lo, hi)]
        grid.add_row(Text(f"dev {d} "), *cells)
    return grid


def legend() -> Text:
    out = Text("legend: ")
    for kind in ("F", "I", "W", "B"):
        out.append(f" {kind} ", style=palette.KINDS[kind].terminal)
        out.append(" ")
    out.append(" ›m send ", style=palette.SEND_F.terminal)
    out.append(" ‹m recv ", style=palette.RECV_F.terminal)
    out.append("  darker = second chunk on the device; numbers are micro-batches", style="dim")
    return out


def print_grid(table: ScheduleTable, slots: IdealizedTable | None = None,
               console: Console | None = None, title: str | None = None, letters: bool = False) -> None:
    """Print the coloured grid in blocks of columns that fit the console, then the legend."""
    console = console or Console()
    if title:
        console.print(Text(title, style="bold"))
    longest = max((len(r) for r in _grid_rows(table, slots)), default=0)
    per_block = max(1, (console.width - 8) // (4 if letters else 3))
    for lo in range(0, max(longest, 1), per_block):
        console.print(grid_renderable(table, slots, lo, lo + per_block, letters))
    console.print(legend())


def grid_text(table: ScheduleTable, slots: IdealizedTable | None = None, width: int = 100) -> str:
    """The grid as plain text with kind letters (``F3``, ``›F3`` for a send), e.g. for logs."""
    console = Console(record=True, width=width, color_system=None, file=io.StringIO())
    print_grid(table, slots, console, letters=True)
    return console.export_text()


def _bars(bars: Iterable[Sequence]) -> list[Bar]:
    out = []
    for b in bars:
        if not 4 <= len(b) <= 5:
            raise ScheduleError(f"a bar is (label, kind, start, end[, text]); got {tuple(b)!r}")
        bar = Bar(str(b[0]), str(b[1]), float(b[2]), float(b[3]), str(b[4]) if len(b) == 5 else "")
        if not bar.end >= bar.start:
            raise ScheduleError(f"bar {bar.text or bar.kind} on {bar.label!r} ends at {bar.end} "
                                f"before it starts at {bar.start}")
        out.append(bar)
    return out


def bars_trace(bars: Iterable[Sequence], unit_us: float = 1e6, process: str = "octopipe") -> dict:
    """The Chrome trace of `bars` (times multiplied by `unit_us` → µs): a thread per lane."""
    items = _bars(bars)
    lanes: dict[str, int] = {}
    for b in items:
        lanes.setdefault(b.label, len(lanes))
    tr = TraceBuilder()
    tr.process(0, process)
    for label, t in lanes.items():
        tr.thread(0, t, label)
    for b in items:
        tr.slice(b.text or b.kind, b.kind, (0, lanes[b.label]), b.start * unit_us, (b.end - b.start) * unit_us)
    return tr.document()


def idealized_bars(it: IdealizedTable) -> list[Bar]:
    """A bar per compute action of an idealized table, lanes `dev 0`, `dev 1`, …"""
    return [Bar(*row) for row in it.rows()]


def idealized_timeline(it: IdealizedTable) -> Timeline:
    """The device timeline of an idealized table, in slots (no transfers: they take no slot)."""
    acts = it.actions
    return timeline(it.n_devices, {"device": it.device, "kind": [a.kind.value for a in acts],
                                   "start": it.start, "end": it.end,
                                   "stage": [a.stage for a in acts],
                                   "microbatch": [a.microbatch for a in acts]}, time_unit="slot")


def idealized_timeline_png(path: str | Path, it: IdealizedTable, title: str | None = None) -> Path:
    """The device timeline PNG of an idealized table (time in slots)."""
    title = title or (f"{it.table.name}: {it.makespan:g} slots, bubble {it.bubble_ratio:.1%} "
                      f"(F:I:W = {it.costs.f:g}:{it.costs.i:g}:{it.costs.w:g})")
    return save_timeline_png(path, idealized_timeline(it), title)


def idealized_trace(it: IdealizedTable) -> dict:
    """The Chrome trace of an idealized table, one slot shown as one millisecond."""
    return bars_trace(idealized_bars(it), IDEALIZED_SLOT_US, process=f"{it.table.name} (idealized)")



__all__ = [
    "IDEALIZED_SLOT_US",
    "ActionKind",
    "Bar",
    "bars_trace",
    "grid_renderable",
    "grid_text",
    "idealized_bars",
    "idealized_timeline",
    "idealized_timeline_png",
    "idealized_trace",
    "kind_colour",
    "legend",
    "print_grid",
    "write_trace",
]
