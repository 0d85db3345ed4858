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
    megatron_layout: str | None = setting(None, "a Megatron-LM --pipeline-model-parallel-layout to "
                                                "evaluate (e.g. 'Ettt|(tt|)*14,tt|tttL')")
    hybrid_pattern: str | None = setting(None, "a Megatron-LM --hybrid-layer-pattern with '|' stage "
                                               "bounds, for hybrid presets")
    torchtitan_fqns: tuple[tuple[str, ...], ...] | None = setting(
        None, "torchtitan's module_fqns_per_model_part, run with schedule=<name> or schedule.file=CSV")
    deepspeed_parts: tuple[int, ...] | None = setting(None, "DeepSpeed PipelineModule parts (layer "
                                                            "bounds, stages + 1 of them)", ge=0, min_items=2)

    def imported(self) -> str | None:
        """The stack whose configuration is given (None: a named schedule or a file)."""
        for key, stack in (("megatron_layout", "megatron"), ("hybrid_pattern", "megatron"),
                           ("torchtitan_fqns", "torchtitan"), ("deepspeed_parts", "deepspeed")):
            if getattr(self, key) is not None:
                return stack
        return None
