"""Artifacts several modes produce: a plan (plan.json with schedule.csv beside it), a table
as torch CSV, JSON and text documents."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from octopipe.io import json_text
from octopipe.modes.mode_result import Artifact
from octopipe.plan import Plan
from octopipe.plan_io import plan_to_doc
from octopipe.schedule.csv_io import write_csv
from octopipe.schedule.table import ScheduleTable


def text_artifact(name: str, text: str) -> Artifact:
    return Artifact(name, lambda path: Path(path).write_text(text))


def json_artifact(name: str, doc: Any) -> Artifact:
    """`doc` in the project's JSON form (indented, sorted keys)."""
    return text_artifact(name, json_text(doc))


def compact_json_artifact(name: str, doc: Any) -> Artifact:
    """`doc` on one line (large traces)."""
    return text_artifact(name, json.dumps(doc))


def table_artifact(name: str, table: ScheduleTable) -> Artifact:
    """`table` as torch CSV (compute_comms when lowered)."""
    fmt = "compute_comms" if table.is_lowered else "compute_only"
    return Artifact(name, lambda path: write_csv(table, path, fmt))


def plan_artifacts(plan: Plan, name: str = "plan.json",
                   csv_name: str = "schedule.csv") -> tuple[Artifact, Artifact]:
    """The plan document and its table beside it, as `save_plan` writes them."""
    doc = json.dumps(plan_to_doc(plan, csv_name), indent=1) + "\n"
    return table_artifact(csv_name, plan.table), text_artifact(name, doc)
