"""Progress of a long experiment: a rich bar with the case being run and the time left.

Experiments report through a `Progress` callback, `(case, done, total)` before each case and
once more with `done == total` at the end, so tests can watch progress without a terminal;
`progress_bar` draws it when stdout is a terminal and is silent otherwise.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.progress import (BarColumn, Progress as RichProgress, TaskProgressColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

Progress = Callable[[str, float, float], None]


def no_progress(case: str, done: float, total: float) -> None:
    """The silent `Progress`."""


@contextmanager
def progress_bar(title: str, show: bool | None = None) -> Iterator[Progress]:
    """A `Progress` drawn as a transient rich bar; `show=None` draws it only on a terminal."""
    if show is None:
        show = sys.stdout.isatty()
    if not show:
        yield no_progress
        return
    columns = (TextColumn(f"[bold]{title}[/]"), BarColumn(), TaskProgressColumn(),
               TextColumn("{task.description} ·"), TimeElapsedColumn(), TextColumn("elapsed ·"),
               TimeRemainingColumn(), TextColumn("left"))
    with RichProgress(*columns, transient=True) as bar:
        task = bar.add_task("", total=None)

        def update(case: str, done: float, total: float) -> None:
            bar.update(task, description=case, completed=done, total=total)
        yield update
