"""The plan JSON document: what a torch CSV cannot carry, versioned, with the CSV beside it.

Layout (``format`` = ``"octopipe.plan"``, ``version`` = `FORMAT_VERSION`)::

    {"format": "octopipe.plan", "version": 1,
     "model": "...", "cluster": "...",
     "partition": [[lo, hi], ...],            # stage s holds layers lo..hi-1
     "n_devices": p, "n_stages": S, "n_microbatches": m,
     "placement": [device of stage s, ...],  # replica 0
     "replicas": [[...], ...], "mb_replica": [...],   # Chimera-style extra pipelines
     "schedule": {"name": "...", "lowered": false, "rows": [["0F0", "", ...], ...]},
     "action_costs": {"0F0": seconds, ...},  # when known, else absent
     "csv": "plan.csv",                      # torch dialect, beside the JSON
     "meta": {..., "pieces": {"11": 3, ...}}}  # `Plan.pieces`, when layers are split

The rows in the JSON are authoritative; the CSV is written for torch and for people, and
`load_plan` does not read it. Per-action costs travel in ``plan.meta["action_costs"]`` (a
mapping from action string to seconds; `octopipe.cost.action_costs` computes them). `Plan.pieces`
(original layer index -> pieces of that layer) is stored in ``meta.pieces``; files written before
the rename kept it in ``meta.shards``, and its provenance as ``shard_names``, ``shard_costs`` and
``shard_choice`` (earlier still ``split_names``, ``split_costs``): `plan_from_doc` reads every
spelling and a saved plan carries the new names (``piece_names``, ``piece_costs``,
``piece_choice``).
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from octopipe.errors import ScheduleError
from octopipe.io import read_text, regular_file, write_text
from octopipe.plan import Plan, SchedulePolicy
from octopipe.schedule.action import Action
from octopipe.schedule.csv_io import read_csv, write_csv
from octopipe.schedule.lower import validate_lowered
from octopipe.schedule.table import ScheduleTable
from octopipe.schedule.validate import validate

FORMAT = "octopipe.plan"
FORMAT_VERSION = 1
_REQUIRED = ("format", "version", "partition", "n_microbatches", "placement", "schedule")
# meta keys of plans written before the layer pieces were called pieces -> their names now
OLD_META_KEYS = {"split_names": "piece_names", "split_costs": "piece_costs", "shard_names": "piece_names",
                 "shard_costs": "piece_costs", "shard_choice": "piece_choice"}


def _jsonable(value: Any, where: str) -> Any:
    """Plain JSON values from numpy scalars/arrays, tuples and paths; refuse anything else."""
    if value is None or isinstance(value, (bool, str, int, float)):
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if hasattr(value, "tolist"):
        return _jsonable(value.tolist(), where)
    raise ScheduleError(f"{where} holds a {type(value).__name__}, which a plan JSON cannot store; "
                        "keep plan.meta to numbers, strings, lists and mappings")


def plan_to_doc(plan: Plan, csv_name: str | None = None) -> dict:
    """The JSON document of `plan` (see the module docstring for its fields)."""
    t = plan.table
    meta = dict(plan.meta)
    costs = meta.pop("action_costs", None)
    doc: dict[str, Any] = {
        "format": FORMAT, "version": FORMAT_VERSION,
        "model": plan.model, "cluster": plan.cluster,
        "partition": [list(r) for r in plan.partition],
        "n_devices": t.n_devices, "n_stages": t.n_stages, "n_microbatches": t.n_microbatches,
        "placement": list(t.placement),
        "replicas": [list(r) for r in t.replicas], "mb_replica": list(t.mb_replica),
        "schedule": {"name": t.name, "lowered": t.is_lowered, "rows": t.as_strings()},
    }
    if costs is not None:
        doc["action_costs"] = {str(k): float(v) for k, v in costs.items()}
    if csv_name is not None:
        doc["csv"] = csv_name
    if plan.policy is not None:
        meta["policy"] = plan.policy.to_doc()
    if plan.pieces:
        meta["pieces"] = {str(k): int(v) for k, v in plan.pieces.items()}
    doc["meta"] = _jsonable(meta, "plan.meta")
    return doc


def save_plan(plan: Plan, path: str | Path, csv_path: str | Path | None = None) -> Path:
    """Write `plan` as JSON at `path` and its table as torch CSV beside it (default `<stem>.csv`).

    A compute-only table is written as `compute_only` CSV, a lowered one as `compute_comms`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    csv_path = path.with_suffix(".csv") if csv_path is None else Path(csv_path)
    if csv_path.resolve() == path.resolve():
        raise ScheduleError(f"csv_path {str(csv_path)!r} is the plan JSON's own path; pick another name")
    text = json.dumps(plan_to_doc(plan, os.path.relpath(csv_path, path.parent)), indent=1) + "\n"
    write_csv(plan.table, csv_path, "compute_comms" if plan.table.is_lowered else "compute_only")
    write_text(path, text)
    return path


def _field(doc: Mapping, key: str, source: str, kind: type | tuple[type, ...]) -> Any:
    if key not in doc:
        raise ScheduleError(f"{source}: field {key!r} is missing; a plan JSON needs "
                            f"{', '.join(_REQUIRED)}")
    value = doc[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ScheduleError(f"{source}: field {key!r} must be a {names}, got {type(value).__name__}")
    return value


def plan_from_doc(doc: Any, source: str = "plan JSON", check: bool = True) -> Plan:
    """Rebuild a Plan from its document; `check` validates the table (marked grid on error)."""
    if not isinstance(doc, Mapping):
        raise ScheduleError(f"{source}: expected a JSON object at the top level")
    fmt = _field(doc, "format", source, str)
    if fmt != FORMAT:
        raise ScheduleError(f"{source}: format {fmt!r} is not {FORMAT!r}; is this a plan JSON?")
    version = _field(doc, "version", source, int)
    if version != FORMAT_VERSION:
        raise ScheduleError(f"{source}: plan format version {version} is not supported; this "
                            f"OctoPipe reads version {FORMAT_VERSION} (re-export the plan with it)")
    partition = _field(doc, "partition", source, list)
    n_mb = _field(doc, "n_microbatches", source, int)
    placement = _field(doc, "placement", source, list)
    sched = _field(doc, "schedule", source, dict)
    rows = _field(sched, "rows", f"{source} schedule", list)
    parsed: list[list[Action | None]] = []
    for r, row in enumerate(rows):
        if not isinstance(row, list):
            raise ScheduleError(f"{source}: schedule.rows[{r}] must be a list of action strings")
        out: list[Action | None] = []
        for c, cell in enumerate(row):
            if not isinstance(cell, str):
                raise ScheduleError(f"{source}: schedule.rows[{r}][{c}] must be a string, got {cell!r}")
            try:
                out.append(Action.parse(cell) if cell.strip() else None)
            except ScheduleError as e:
                raise ScheduleError(f"{source}: schedule.rows[{r}][{c}] = {cell!r}: {e}") from None
        parsed.append(out)
    if "n_devices" in doc and doc["n_devices"] != len(parsed):
        raise ScheduleError(f"{source}: n_devices is {doc['n_devices']} but schedule.rows has "
                            f"{len(parsed)} rows")
    table = ScheduleTable(tuple(tuple(r) for r in parsed), tuple(placement), n_mb,
                          str(sched.get("name", "custom")),
                          tuple(tuple(r) for r in doc.get("replicas", ())), tuple(doc.get("mb_replica", ())))
    if "n_stages" in doc and doc["n_stages"] != table.n_stages:
        raise ScheduleError(f"{source}: n_stages is {doc['n_stages']} but placement lists "
                            f"{table.n_stages} stages")
    if check:
        if table.is_lowered:
            validate_lowered(table)
        else:
            validate(table)
    meta = dict(doc.get("meta") or {})
    if "action_costs" in doc:
        meta["action_costs"] = dict(doc["action_costs"])
    pieces = meta.pop("pieces", None) or meta.pop("shards", None) or {}   # "shards": files before the rename
    policy = meta.pop("policy", None)
    if policy is not None and not isinstance(policy, Mapping):
        raise ScheduleError(f"{source}: meta.policy must be an object, got {type(policy).__name__}")
    for old, new in OLD_META_KEYS.items():
        if old in meta:
            meta.setdefault(new, meta.pop(old))
    try:
        parts = tuple((int(lo), int(hi)) for lo, hi in partition)
    except (TypeError, ValueError):
        raise ScheduleError(f"{source}: partition must be a list of [lo, hi] layer ranges") from None
    return Plan(parts, table, str(doc.get("model", "")), str(doc.get("cluster", "")), meta, pieces,
                SchedulePolicy.from_doc(policy, source) if policy is not None else None)


def load_plan(path: str | Path, check: bool = True) -> Plan:
    """Read a plan JSON written by `save_plan`."""
    path = Path(path)
    if not path.is_file():
        raise ScheduleError(f"plan file {str(path)!r} does not exist")
    try:
        doc = json.loads(read_text(path, "schedule.file"))
    except json.JSONDecodeError as e:
        raise ScheduleError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    return plan_from_doc(doc, str(path), check)


def load_schedule_file(path: str | Path, **csv_kwargs) -> ScheduleTable:
    """A table from a plan JSON or a torch CSV (`schedule.file=PATH`), chosen by content."""
    path = Path(path)
    regular_file(path, "schedule.file")
    with open(path, "rb") as f:
        head = f.read(64).decode("utf-8", errors="replace").lstrip()
    if path.suffix.lower() == ".json" or head.startswith("{"):
        return load_plan(path).table
    return read_csv(path, **csv_kwargs)


__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "load_plan",
    "load_schedule_file",
    "plan_from_doc",
    "plan_to_doc",
    "save_plan",
]
