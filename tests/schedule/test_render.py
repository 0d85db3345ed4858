"""Pictures: terminal grid, PNG Gantt chart and Chrome trace carry the table's actual content."""
from __future__ import annotations

import io
import json

import pytest
from hand_tables import one_f_one_b
from rich.console import Console

from octopipe.errors import ScheduleError
from octopipe.schedule.idealized import idealize
from octopipe.schedule.lower import lower
from octopipe.schedule.render import (
    Bar,
    bars_trace,
    grid_text,
    idealized_timeline_png,
    idealized_trace,
    kind_colour,
    print_grid,
    write_trace,
)


def test_grid_text_lists_each_row_in_order():
    text = grid_text(one_f_one_b(2, 2))
    lines = [ln.split() for ln in text.splitlines() if ln.strip().startswith("dev")]
    assert lines == [["dev", "0", "F0", "F1", "B0", "B1"], ["dev", "1", "F0", "B0", "F1", "B1"]]


def test_slot_grid_shows_idle_slots_and_multi_slot_actions():
    it = idealize(one_f_one_b(2, 1), "1:1:1")  # F=1, B=2
    text = grid_text(it.table, it)
    rows = {ln.split()[1]: ln.split()[2:] for ln in text.splitlines() if ln.strip().startswith("dev")}
    assert rows["0"] == ["F0", "·", "·", "·", "B0", "B0"]
    assert rows["1"] == ["·", "F0", "B0", "B0", "·", "·"]


def test_lowered_grid_marks_sends_and_receives():
    text = grid_text(lower(one_f_one_b(2, 1)))
    assert "›F0" in text and "‹F0" in text and "›B0" in text and "‹B0" in text


def test_wide_grids_wrap_into_column_blocks_and_colour():
    buf = io.StringIO()
    console = Console(file=buf, width=40, force_terminal=True, color_system="standard")
    print_grid(one_f_one_b(4, 8), console=console, title="1f1b")
    out = buf.getvalue()
    assert "\x1b[" in out  # coloured
    assert out.count("dev 3") == 2  # 16 actions in blocks of 10 columns


def test_the_timeline_png_of_an_idealized_table_is_written(tmp_path):
    it = idealize(one_f_one_b(3, 4), "1:1:1")
    path = idealized_timeline_png(tmp_path / "timeline.png", it)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


def test_bars_trace_events_carry_the_slots(tmp_path):
    it = idealize(one_f_one_b(2, 2), "1:1:1")
    trace = idealized_trace(it)
    ev = {e["name"]: e for e in trace["traceEvents"] if e["ph"] == "X"}
    assert len(ev) == 8
    assert ev["1B0"]["ts"] == 2000.0 and ev["1B0"]["dur"] == 2000.0 and ev["1B0"]["cat"] == "B"
    lanes = {e["args"]["name"]: e["tid"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert ev["1B0"]["tid"] == lanes["dev 1"]
    path = write_trace(tmp_path / "trace.json", trace)
    assert json.loads(path.read_text()) == trace


def test_generic_bars_in_seconds():
    trace = bars_trace([Bar("dev 0", "F", 0.5, 0.75, "0F0")])
    (x,) = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert (x["ts"], x["dur"], x["name"]) == (500000.0, 250000.0, "0F0")


def test_bad_bars_are_refused(tmp_path):
    with pytest.raises(ScheduleError, match="ends at 1.0 before it starts at 2.0"):
        bars_trace([("dev 0", "F", 2.0, 1.0)])
    with pytest.raises(ScheduleError, match=r"a bar is \(label, kind, start, end\[, text\]\)"):
        bars_trace([("dev 0", "F", 1.0)])


def test_kind_colours_are_stable_and_distinct():
    assert kind_colour("F") != kind_colour("B") != kind_colour("W")
    assert kind_colour("allreduce") == kind_colour("allreduce")
