"""Declaring config fields: a default, a one-line doc and the valid range, in one place.

Every config group is a frozen dataclass whose fields are declared with `setting(...)`; the
metadata it attaches (doc, bounds) is what `octopipe.config.convert` checks and what error
messages and the README quote. Choices are `Literal[...]` annotations.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Bounds:
    """The valid range of a numeric field: `ge`/`gt` below, `le`/`lt` above (None: unbounded)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    min_items: int = 0              # a list field: the fewest items it may hold

    def holds(self, x: float) -> bool:
        return ((self.ge is None or x >= self.ge) and (self.gt is None or x > self.gt)
                and (self.le is None or x <= self.le) and (self.lt is None or x < self.lt))

    def text(self) -> str:
        """'>= 1', '> 0 and <= 1', ... for error messages."""
        parts = [f"{op} {v if isinstance(v, int) else format(v, 'g')}"
                 for op, v in ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt)) if v is not None]
        return " and ".join(parts) or "any number"


REQUIRED: Any = dataclasses.MISSING
"""The default of a field every preset must give (a model's `hidden`): no default at all."""


def setting(default: Any, doc: str, *, ge: float | None = None, gt: float | None = None,
            le: float | None = None, lt: float | None = None, min_items: int = 0) -> Any:
    """A dataclass field with its default (or REQUIRED), its doc, (for numbers) its valid range
    and (for lists) the fewest items it may hold.

    Mutable defaults (lists, dicts, dataclass instances) are copied per instance."""
    meta = {"doc": doc, "bounds": Bounds(ge, gt, le, lt, min_items)}
    if default is REQUIRED:
        return dataclasses.field(metadata=meta)
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        value = default
        return dataclasses.field(default_factory=lambda: _copy(value), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _copy(value: Any) -> Any:
    if isinstance(value, list):
        return [_copy(v) for v in value]
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


def doc_of(field: dataclasses.Field) -> str:
    return str(field.metadata.get("doc", ""))


def bounds_of(field: dataclasses.Field) -> Bounds:
    return field.metadata.get("bounds", Bounds())
