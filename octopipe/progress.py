"""The progress bar of long runs: the case being run, a bar, cases done and the time left.

One look for every long loop (experiments, the solver comparison): `case_progress(total,
title)` yields `step(label)`, to call as each case starts; `track_cases(items, title,
describe)` wraps a loop. The bar is drawn only when the console writes to a terminal, so tests
and piped output stay clean; `on_case(done, total, label)` receives every step wherever it runs.
A bar started while another is live joins it as a second line instead of failing.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, TypeVar

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

T = TypeVar("T")
Step = Callable[[str], None]
OnCase = Callable[[int, int, str], None]
_LIVE: list[Progress] = []   # the bar on screen, shared by nested case_progress calls


def progress_columns() -> tuple:
    """The columns of every OctoPipe bar: title, bar, done/total, elapsed, left, current case."""
    return (TextColumn("[bold]{task.fields[title]}[/]"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("·"), TimeRemainingColumn(), TextColumn("left"),
            TextColumn("[dim]{task.description}[/]"))


@contextmanager
def case_progress(total: int, title: str, console: Console | None = None,
                  on_case: OnCase | None = None) -> Iterator[Step]:
    """Yield `step(label)`: the previous case is done, `label` runs now."""
    console = console or Console()
    done = [-1]
    if not console.is_terminal:
        def step_quiet(label: str) -> None:
            done[0] += 1
            if on_case is not None:
                on_case(done[0], total, label)
        yield step_quiet
        return
    nested = bool(_LIVE)
    prog = _LIVE[0] if nested else Progress(*progress_columns(), console=console, transient=True)
    if not nested:
        prog.start()
        _LIVE.append(prog)
    task = prog.add_task("", total=total, title=title)

    def step(label: str) -> None:
        done[0] += 1
        prog.update(task, completed=done[0], description=label)
        if on_case is not None:
            on_case(done[0], total, label)
    try:
        yield step
    finally:
        prog.remove_task(task)
        if not nested:
            _LIVE.clear()
            prog.stop()


def track_cases(items: Iterable[T], title: str, describe: Callable[[T], str] = str,
                console: Console | None = None, on_case: OnCase | None = None) -> Iterator[T]:
    """Each of `items` (a sized collection), with the bar at `describe(item)` while it runs."""
    items = list(items)
    with case_progress(len(items), title, console, on_case) as step:
        for item in items:
            step(describe(item))
            yield item


__all__ = ["case_progress", "track_cases", "progress_columns"]
