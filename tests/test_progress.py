"""The progress bars (by case and weighted): drawn on a terminal only, silent elsewhere,
callbacks everywhere."""
from __future__ import annotations

import io

from rich.console import Console

from octopipe.progress import case_progress, track_cases, weighted_progress


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=120), buf


def test_no_terminal_no_output_but_the_callback_sees_every_case():
    console, buf = _console(False)
    seen = []
    items = list(track_cases(["a", "b", "c"], "exp", str.upper, console,
                             on_case=lambda done, total, label: seen.append((done, total, label))))
    assert items == ["a", "b", "c"]
    assert seen == [(0, 3, "A"), (1, 3, "B"), (2, 3, "C")]
    assert buf.getvalue() == ""


def test_on_a_terminal_the_bar_shows_title_case_and_time_left():
    console, buf = _console(True)
    with case_progress(2, "octopipe_authors", console) as step:
        step("nemotron pp=4")
    out = buf.getvalue()
    assert "octopipe_authors" in out and "left" in out


def test_a_bar_inside_a_bar_joins_it():
    console, buf = _console(True)
    with case_progress(2, "outer", console) as outer:
        outer("case 1")
        for _ in track_cases(range(3), "inner", console=console):
            pass
        outer("case 2")
    assert "outer" in buf.getvalue()


def test_an_error_inside_the_loop_stops_the_bar():
    console, _ = _console(True)
    try:
        with case_progress(1, "x", console) as step:
            step("boom")
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    with case_progress(1, "again", console) as step:  # a fresh bar starts: the first one stopped
        step("ok")


def test_the_weighted_bar_is_silent_off_a_terminal_and_draws_on_demand(capsys):
    with weighted_progress("solvers") as update:
        update("case", 1.0, 2.0)
    assert capsys.readouterr().out == ""
    console, buf = _console(False)
    with weighted_progress("solvers", show=True, console=console) as update:
        update("case", 1.0, 2.0)
        update("done", 2.0, 2.0)
    console, buf = _console(True)
    with weighted_progress("solvers", console=console) as update:
        update("tiny/h100/S2", 1.0, 4.0)
    out = buf.getvalue()
    assert "solvers" in out and "left" in out


def test_a_weighted_bar_inside_a_case_bar_joins_it():
    console, buf = _console(True)
    with case_progress(1, "outer", console) as outer:
        outer("case 1")
        with weighted_progress("inner", console=console) as update:
            update("x", 0.5, 1.0)
    with weighted_progress("again", console=console) as update:  # the outer bar stopped
        update("y", 1.0, 1.0)
    assert "outer" in buf.getvalue()
