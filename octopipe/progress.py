"""The progress bar of long runs: the case being run, a bar, how much is done and the time left.

One look for every long loop (experiments, the solver comparison): `case_progress(total,
title)` yields `step(label)`, to call as each case starts; `track_cases(items, title,
describe)` wraps a loop. Where cases weigh differently (the solver comparison weighs each
instance by its size), `weighted_progress(title)` yields `update(case, done, total)` in those
weights. A bar is drawn only when the console writes to a terminal, so tests and piped output
stay clean; `on_case(done, total, label)` receives every step wherever it runs. A bar started
while another is live joins it as a second line instead of failing.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

T = TypeVar("T")
Step = Callable[[str], None]
OnCase = Callable[[int, int, str], None]
WeightedStep = Callable[[str, float, float], None]   # (case, done, total), in the cases' weights
_LIVE: list[Progress] = []   # the bar on screen, shared by nested bars


def progress_columns(done: ProgressColumn | None = None) -> tuple:
    """The columns of every OctoPipe bar: title, bar, done (cases done/total unless `done` says
    otherwise), elapsed, left, current case."""
    return (TextColumn("[bold]{task.fields[title]}[/]"), BarColumn(), done or MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("·"), TimeRemainingColumn(), TextColumn("left"),
            TextColumn("[dim]{task.description}[/]"))


@contextmanager
def _bar(console: Console, columns: tuple) -> Iterator[Progress]:
    """The live bar: the one on screen when there is one (a nested bar joins it), else a new
    transient one, stopped on the way out."""
    if _LIVE:
        yield _LIVE[0]
        return
    prog = Progress(*columns, console=console, transient=True)
    prog.start()
    _LIVE.append(prog)
    try:
        yield prog
    finally:
        _LIVE.clear()
        prog.stop()


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
    with _bar(console, progress_columns()) as prog:
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


def track_cases(items: Iterable[T], title: str, describe: Callable[[T], str] = str,
                console: Console | None = None, on_case: OnCase | None = None) -> Iterator[T]:
    """Each of `items` (a sized collection), with the bar at `describe(item)` while it runs."""
    items = list(items)
    with case_progress(len(items), title, console, on_case) as step:
        for item in items:
            step(describe(item))
            yield item


def no_progress(case: str, done: float, total: float) -> None:
    """The silent `WeightedStep`."""


@contextmanager
def weighted_progress(title: str, show: bool | None = None,
                      console: Console | None = None) -> Iterator[WeightedStep]:
    """Yield `update(case, done, total)`: `case` runs now, `done` of `total` (any weights) is
    done; the bar shows the share done. `show=None` draws it only on a terminal."""
    console = console or Console()
    if not (console.is_terminal if show is None else show):
        yield no_progress
        return
    with _bar(console, progress_columns(TaskProgressColumn())) as prog:
        task = prog.add_task("", total=None, title=title)

        def update(case: str, done: float, total: float) -> None:
            prog.update(task, description=case, completed=done, total=total)
        try:
            yield update
        finally:
            prog.remove_task(task)


__all__ = [
    "OnCase",
    "Step",
    "WeightedStep",
    "case_progress",
    "no_progress",
    "progress_columns",
    "track_cases",
    "weighted_progress",
]
