"""Markdown for reports: tables from rows, headings, bullet lists and values written as words
and numbers, never as a Python repr."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def cell(value: Any) -> str:
    """A value as a table cell or in a sentence: floats to 4 significant digits, mappings as
    `key: value` pairs, sequences comma-separated, None as a dash."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {cell(v)}" for k, v in value.items()) or "-"
    if isinstance(value, (list, tuple, set, frozenset)):
        return ", ".join(cell(v) for v in value) or "-"
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """The lines of a Markdown table."""
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return out


def mapping_table(values: Mapping[str, Any], key: str = "field", value: str = "value") -> list[str]:
    """A two-column table of a mapping's items."""
    return table((key, value), values.items())


def heading(text: str, level: int = 2) -> list[str]:
    return ["", "#" * level + " " + text, ""]


def bullets(items: Iterable[Any]) -> list[str]:
    return [f"- {cell(x)}" for x in items]
