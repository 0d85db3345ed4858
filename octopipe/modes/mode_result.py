"""What a mode returns: figures, a terminal report and artifacts, as values.

Modes compute; the reporter (`octopipe.modes.report`) prints `Result.report` and writes
`summary.json` and every artifact atomically into the run directory. A mode neither prints nor
writes files.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Artifact:
    """One file of a run: `write(path)` produces it (the reporter makes the write atomic)."""

    name: str                                  # file name inside the run directory
    write: Callable[[Path], None] = field(compare=False)


@dataclass(frozen=True)
class Result:
    """A mode's outcome: `summary` becomes summary.json; `report` is printed in order (strings
    with rich markup or rich renderables such as tables); `artifacts` are written beside it."""

    summary: dict[str, Any]
    report: tuple[Any, ...] = ()
    artifacts: tuple[Artifact, ...] = ()
