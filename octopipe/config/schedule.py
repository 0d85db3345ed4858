"""`schedule`: a named schedule or a schedule file."""
from __future__ import annotations

from dataclasses import dataclass

from octopipe.config.fields import setting


@dataclass(frozen=True)
class ScheduleConfig:
    """`schedule=<name>` (a preset per entry of `schedule.library.SCHEDULE_PRESETS`, stored by
    `config.store.register`) or `schedule.file=PATH`."""

    name: str | None = setting(None, "a named schedule (octopipe.schedule.library.SCHEDULES)")
    file: str | None = setting(None, "a plan JSON or a torch CSV, used instead of the name")
