"""torch.distributed.pipelining's CSV dialect for schedule tables.

A row per rank, no header, one action per cell in torch's string form (`2F0`, `1SEND_B3`).
Two formats, as in `_PipelineScheduleRuntime._load_csv`:

- ``compute_only``: compute actions; an empty cell is an idle slot of a time-aligned table.
- ``compute_comms``: a lowered table (SEND/RECV included) with no empty cells.

Every cell is parsed with `Action.parse` (full match; the legacy ``BW`` token is refused with
the reason). A CSV holds neither the placement nor the micro-batch count, so `read_csv` takes
them as arguments or infers them: the micro-batch count from the largest index, the placement
from the row that holds each (stage, micro-batch) as torch does; micro-batches that travel
through a different stage → device map (Chimera's second pipeline) become replicas.

torch writes some runtime-only cells into its compute lists: ``UNSHARD``/``RESHARD`` (FSDP),
``REDUCE_GRAD`` (data-parallel gradient sync) and ``(a;b)OVERLAP_F_B`` groups (DualPipeV). With
``strict=False`` (the default) the first three are dropped, since they carry no ordering of
pipeline work, and a group is expanded into its sub-actions in order; ``strict=True`` refuses
them.
"""
from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from octopipe.errors import ScheduleError
from octopipe.io import read_text, regular_file
from octopipe.schedule.action import Action
from octopipe.schedule.lower import lower, validate_lowered
from octopipe.schedule.table import ScheduleTable
from octopipe.schedule.validate import validate

CsvFormat = Literal["compute_only", "compute_comms"]
FORMATS = ("compute_only", "compute_comms")

_TORCH_ONLY_RE = re.compile(r"\d+(UNSHARD|RESHARD|REDUCE_GRAD)")
_OVERLAP_RE = re.compile(r"\((.*)\)OVERLAP_F_B")


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ScheduleError(f"CSV format {fmt!r} is unknown; use 'compute_only' or 'compute_comms'")


def to_csv_text(table: ScheduleTable, format: CsvFormat = "compute_only") -> str:
    """The table as torch CSV text; `compute_comms` lowers a compute-only table first."""
    _check_format(format)
    if format == "compute_only":
        rows = table.compute_only().as_strings()
    else:
        rows = (table if table.is_lowered else lower(table)).compact().as_strings()
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for r in rows:
        writer.writerow(r)
    return buf.getvalue()


def write_csv(table: ScheduleTable, path: str | Path, format: CsvFormat = "compute_only") -> Path:
    """Write `table` as torch CSV at `path` (see `to_csv_text`); returns the path."""
    path = Path(path)
    path.write_text(to_csv_text(table, format))
    return path


def _parse_cell(cell: str, where: str, strict: bool) -> list[Action] | None:
    token = cell.strip()
    if not token:
        return None
    if not strict:
        if _TORCH_ONLY_RE.fullmatch(token):
            return []
        group = _OVERLAP_RE.fullmatch(token)
        if group:
            return [_parse_one(t, where) for t in group.group(1).split(";") if t.strip()]
    return [_parse_one(token, where)]


def _parse_one(token: str, where: str) -> Action:
    try:
        return Action.parse(token)
    except ScheduleError as e:
        raise ScheduleError(f"{where}: {e}") from None


def parse_csv_rows(text: str, source: str = "CSV", format: CsvFormat | None = None,
                   strict: bool = False) -> tuple[list[list[Action | None]], CsvFormat]:
    """Parse CSV text into rows of actions; returns the rows and the (given or detected) format."""
    if format is not None:
        _check_format(format)
    rows: list[list[Action | None]] = []
    empties: list[str] = []
    for r, cells in enumerate(csv.reader(io.StringIO(text))):
        row: list[Action | None] = []
        for c, cell in enumerate(cells):
            where = f"{source}: row {r} (rank {r}), column {c}, cell {cell!r}"
            parsed = _parse_cell(cell, where, strict)
            if parsed is None:
                row.append(None)
                empties.append(where)
            else:
                row.extend(parsed)
        rows.append(row)
    while rows and all(a is None for a in rows[-1]):   # trailing blank lines are not ranks
        rows.pop()
    if not rows:
        raise ScheduleError(f"{source} is empty: expected one row of actions per rank")
    lowered = any(a is not None and a.kind.is_comm for r in rows for a in r)
    detected: CsvFormat = "compute_comms" if lowered else "compute_only"
    fmt = format or detected
    if fmt == "compute_only" and lowered:
        r, c, a = next((r, c, a) for r, row in enumerate(rows) for c, a in enumerate(row)
                       if a is not None and a.kind.is_comm)
        raise ScheduleError(f"{source}: row {r} (rank {r}), column {c}, cell {str(a)!r}: a "
                            "compute_only CSV holds no SEND/RECV; read it as compute_comms")
    if fmt == "compute_comms" and empties:
        raise ScheduleError(f"{empties[0]}: a compute_comms CSV has no empty cells (idle slots "
                            "exist only in compute_only tables)")
    return rows, fmt


def infer_placement(rows: Sequence[Sequence[Action | None]], n_stages: int | None = None,
                    n_microbatches: int | None = None, source: str = "CSV"
                    ) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """(placement, replicas, mb_replica) from the row that runs each (stage, micro-batch).

    A SEND/RECV locates its own stage too. Micro-batches whose stage → device map differs from
    micro-batch 0's become replicas, numbered by first appearance.
    """
    dev: dict[tuple[int, int], int] = {}
    for d, row in enumerate(rows):
        for c, a in enumerate(row):
            if a is None:
                continue
            key = (a.stage, a.microbatch)
            if dev.setdefault(key, d) != d:
                raise ScheduleError(f"{source}: stage {a.stage} of micro-batch {a.microbatch} appears "
                                    f"on rank {dev[key]} and on rank {d} (row {d}, column {c}); "
                                    "each (stage, micro-batch) runs on one rank")
    if not dev:
        raise ScheduleError(f"{source} holds no actions")
    n_s = n_stages if n_stages is not None else 1 + max(s for s, _ in dev)
    n_m = n_microbatches if n_microbatches is not None else 1 + max(m for _, m in dev)
    _check_indices(rows, dev, n_s, n_m, source)
    maps: list[tuple[int, ...]] = []
    per_mb: list[int] = []
    for m in range(n_m):
        pl = []
        for s in range(n_s):
            if (s, m) not in dev:
                raise ScheduleError(f"{source}: stage {s} never runs micro-batch {m}, so its rank "
                                    "cannot be inferred; pass placement explicitly or fix the table")
            pl.append(dev[(s, m)])
        if tuple(pl) not in maps:
            maps.append(tuple(pl))
        per_mb.append(maps.index(tuple(pl)))
    if len(maps) == 1:
        return maps[0], (), ()
    return maps[0], tuple(maps[1:]), tuple(per_mb)


def _out_of_range(index: int, present: set[int], limit: int) -> bool:
    """Whether `index` lies beyond `limit`, or beyond a gap (indices below it that no cell names);
    work bounded by the cells, never by the index (a cell may name stage 10**20)."""
    return index >= limit or sum(1 for i in present if i < index) < index


def _gap(present: set[int], bound: int) -> tuple[int, int] | None:
    """The first and the last index below `bound` that no cell names (None: no gap), found from
    the named indices alone."""
    named = sorted(i for i in present if 0 <= i < bound)
    first = next((k for k, i in enumerate(named) if i != k), len(named))
    if first >= bound:
        return None
    last = bound - 1
    for i in reversed(named):
        if i != last:
            break
        last -= 1
    return first, last


def _check_indices(rows: Sequence[Sequence[Action | None]], dev: dict[tuple[int, int], int], n_s: int,
                   n_m: int, source: str) -> None:
    """Name and mark the cell whose stage or micro-batch is out of range: above the count given,
    or above indices that no cell names (a `5F0` in a 2-stage table, a `0F9` with 2 micro-batches)."""
    stages, mbs = {s for s, _ in dev}, {m for _, m in dev}
    for d, row in enumerate(rows):
        for c, a in enumerate(row):
            if a is None:
                continue
            for what, index, present, limit in (("stage", a.stage, stages, n_s),
                                                ("micro-batch", a.microbatch, mbs, n_m)):
                if not _out_of_range(index, present, limit):
                    continue
                known = sorted(i for i in present if i < index and i < limit)
                span = f"0..{known[-1]}" if known else "none"
                many = "stages" if what == "stage" else "micro-batches"
                gap = _gap(present, min(index, limit))
                why = (f"the table has {limit} {many}" if gap is None else f"no cell names {what} "
                       f"{gap[0]}" + (f"..{gap[1]}" if gap[1] > gap[0] else ""))
                raise ScheduleError(f"{source}: row {d} (rank {d}), column {c}, cell {str(a)!r}: {what} "
                                    f"{index} is out of range ({why}; its {many} are {span}); fix "
                                    f"the cell\n{_marked_rows(rows, (d, c))}")


def _marked_rows(rows: Sequence[Sequence[Action | None]], mark: tuple[int, int]) -> str:
    width = max([len(str(a)) for r in rows for a in r if a is not None] + [2]) + 2
    lines = []
    for d, row in enumerate(rows):
        cells = ["." if a is None else str(a) for a in row]
        lines.append(f"dev {d:>3} " + "".join(f"{(f'>{t}<' if (d, c) == mark else t):^{width}}"
                                              for c, t in enumerate(cells)))
    return "\n".join(lines)


def read_csv_text(text: str, *, format: CsvFormat | None = None, placement: Sequence[int] | None = None,
                  n_microbatches: int | None = None, name: str = "csv", strict: bool = False,
                  check: bool = True, source: str = "CSV") -> ScheduleTable:
    """Parse torch CSV text into a ScheduleTable (placement and micro-batches inferred if absent).

    `check` validates the result (`validate` or `validate_lowered`), so a bad table fails here
    with a marked grid rather than later.
    """
    rows, fmt = parse_csv_rows(text, source, format, strict)
    if placement is None:
        place, replicas, mb_replica = infer_placement(rows, None, n_microbatches, source)
    else:
        place, replicas, mb_replica = tuple(placement), (), ()
    if n_microbatches is None:
        n_microbatches = 1 + max(a.microbatch for r in rows for a in r if a is not None)
    if any(d >= len(rows) for d in place):
        raise ScheduleError(f"{source}: placement {tuple(place)} names rank {max(place)} but the CSV "
                            f"has {len(rows)} rows")
    table = ScheduleTable(tuple(tuple(r) for r in rows), place, n_microbatches, name, replicas, mb_replica)
    if check:
        if fmt == "compute_comms":
            validate_lowered(table)
        else:
            validate(table)
    return table


def read_csv(path: str | Path, **kwargs) -> ScheduleTable:
    """Read a torch CSV file; keyword arguments as in `read_csv_text`."""
    path = Path(path)
    regular_file(path, "schedule.file")
    kwargs.setdefault("name", path.stem)
    return read_csv_text(read_text(path, "schedule.file"), source=str(path), **kwargs)


__all__ = [
    "FORMATS",
    "infer_placement",
    "parse_csv_rows",
    "read_csv",
    "read_csv_text",
    "to_csv_text",
    "write_csv",
]
