"""A plan as the files each stack reads: pure functions from a plan to {file name: text}.

- `torch.json` + `torch_schedule.csv`: the stage → rank map and the compute-only table that
  `_PipelineScheduleRuntime._load_csv` takes;
- `torchtitan.json` + `torchtitan.toml` + `torchtitan_schedule.csv`: the `[parallelism]` fields
  of torchtitan's `ParallelismConfig` (module names per model part, the CSV, the degree) and the
  local batch that gives the micro-batch count;
- `megatron.json`: `--pipeline-model-parallel-layout` (or, for hybrid models,
  `--hybrid-layer-pattern` with `|` stage bounds) and the flags to paste;
- `deepspeed.json` + `deepspeed_parts.py`: the layer bounds of a `PipelineModule` and the subclass
  that applies them.

Each writer refuses (ExportError) a plan its stack cannot run, naming the broken rule.
"""
from __future__ import annotations

import json
from collections.abc import Callable

from octopipe.errors import ConfigError
from octopipe.interop.megatron_layout import format_layout
from octopipe.interop.targets import TARGETS, layout_of, unsupported, violations
from octopipe.interop.units import Units
from octopipe.plan import Plan
from octopipe.schedule.csv_io import to_csv_text

EXPORT_TARGETS = ("torch", "torchtitan", "megatron", "deepspeed")


class ExportError(ConfigError):
    """The plan cannot be written for that stack."""


def _check(plan: Plan, target: str, units: Units | None) -> None:
    why = unsupported(TARGETS[target], units)
    if why:
        raise ExportError(why)
    bad = violations(plan, TARGETS[target], units)
    if bad:
        raise ExportError(f"target={target}: {TARGETS[target].stack} cannot run this plan: {bad[0]}; "
                          f"plan it with target={target}")


def _dump(obj: dict) -> str:
    return json.dumps(obj, indent=2) + "\n"


def _stage_modules(plan: Plan, units: Units | None) -> list[list[str]] | None:
    return None if units is None or not units.aligned(plan.partition) else units.stage_names(plan.partition)


def torch_files(plan: Plan, units: Units | None) -> dict[str, str]:
    _check(plan, "torch", None)
    t = plan.table
    modules = _stage_modules(plan, units)
    stages = [{"stage": s, "rank": int(t.placement[s]), "layers": [lo, hi],
               **({"modules": modules[s]} if modules else {})} for s, (lo, hi) in enumerate(plan.partition)]
    doc = {"stage_to_rank": [int(r) for r in t.placement], "n_microbatches": t.n_microbatches,
           "schedule_csv": "torch_schedule.csv", "format": "compute_only", "stages": stages,
           "how": "build stage s (layers [lo, hi)) on rank stage_to_rank[s]; then "
                  "_PipelineScheduleRuntime(stages, n_microbatches)._load_csv('torch_schedule.csv', "
                  "format='compute_only')"}
    return {"torch.json": _dump(doc), "torch_schedule.csv": to_csv_text(t)}


def torchtitan_fields(plan: Plan, units: Units, micro_batch_size: int) -> dict:
    """`{"parallelism": {...}, "training": {...}}`: the fields of torchtitan's config sections."""
    t = plan.table
    style = layout_of(tuple(t.placement), t.n_devices)
    schedule = "ZBVZeroBubble" if style is not None and style[0] == "v" else "PipelineScheduleMulti"
    return {"parallelism": {"pipeline_parallel_degree": t.n_devices,
                            "pipeline_parallel_schedule": schedule,
                            "pipeline_parallel_schedule_csv": "torchtitan_schedule.csv",
                            "module_fqns_per_model_part": units.stage_names(plan.partition),
                            "pipeline_parallel_microbatch_size": micro_batch_size},
            "training": {"local_batch_size": micro_batch_size * t.n_microbatches}}


def _toml_value(v) -> str:
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return str(v)


def torchtitan_files(plan: Plan, units: Units | None, micro_batch_size: int) -> dict[str, str]:
    _check(plan, "torchtitan", units)
    fields = torchtitan_fields(plan, units, micro_batch_size)
    p = fields["parallelism"]
    doc = {k: p[k] for k in ("pipeline_parallel_degree", "pipeline_parallel_schedule",
                             "pipeline_parallel_schedule_csv", "module_fqns_per_model_part")}
    doc["num_pp_microbatches"] = plan.table.n_microbatches
    doc.update(fields)
    toml = ["# torchtitan config fragment written by OctoPipe: set pipeline_parallel_schedule_csv to the "
            "CSV's path as seen from where torchtitan runs",
            *(f"[{section}]\n" + "\n".join(f"{k} = {_toml_value(v)}" for k, v in values.items()) + "\n"
              for section, values in fields.items())]
    return {"torchtitan.json": _dump(doc), "torchtitan.toml": "\n".join(toml),
            "torchtitan_schedule.csv": to_csv_text(plan.table)}


def megatron_fields(plan: Plan, units: Units) -> dict:
    """Megatron-LM's layout of the plan: its stages as E/t/L (or hybrid symbols), the flags."""
    stages = []
    for lo, hi in units.to_units(plan.partition).ranges:
        stages.append([units.symbols[u] for u in range(lo, hi)])
    pp = plan.table.n_devices
    doc = {"pipeline_model_parallel_size": pp, "num_layers": units.decoder_count,
           "virtual_stages_per_rank": len(stages) // pp}
    if units.hybrid:
        pattern = "|".join("".join(s for s in st if s not in ("E", "L")) for st in stages)
        doc["hybrid_layer_pattern"] = pattern
        doc["args"] = ["--pipeline-model-parallel-size", str(pp), "--num-layers", str(units.decoder_count),
                       "--hybrid-layer-pattern", pattern]
        doc["needs"] = "megatron-core >= 0.17 (the '|' stage bounds in the hybrid pattern)"
    else:
        layout = format_layout(stages)
        doc["pipeline_model_parallel_layout"] = layout
        doc["args"] = ["--pipeline-model-parallel-size", str(pp), "--num-layers", str(units.decoder_count),
                       "--pipeline-model-parallel-layout", layout]
    doc["schedule"] = "1F1B" if len(stages) == pp else "interleaved 1F1B (virtual pipeline, from the layout)"
    return doc


def megatron_files(plan: Plan, units: Units | None) -> dict[str, str]:
    _check(plan, "megatron", units)
    return {"megatron.json": _dump(megatron_fields(plan, units))}


DEEPSPEED_SNIPPET = '''\
"""A DeepSpeed PipelineModule whose stages are OctoPipe's plan (deepspeed.json's parts)."""
import json

from deepspeed.pipe import PipelineModule

PARTS = json.load(open("deepspeed.json"))["parts"]


class PlannedPipelineModule(PipelineModule):
    """Stage s holds layers PARTS[s]:PARTS[s + 1] of the layer list, as planned."""

    def _partition_layers(self, method="uniform"):
        stage_id = self._topo.get_coord(self.global_rank).pipe
        self.parts = list(PARTS)
        self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])
'''


def deepspeed_files(plan: Plan, units: Units | None) -> dict[str, str]:
    _check(plan, "deepspeed", units)
    unit_part = units.to_units(plan.partition)
    doc = {"num_stages": len(unit_part), "parts": [int(b) for b in unit_part.bounds],
           "layers": ["+".join(n) for n in units.names], "schedule": "TrainSchedule (1F1B)",
           "micro_batches": plan.table.n_microbatches,
           "how": "PlannedPipelineModule(layers=..., num_stages=num_stages) from deepspeed_parts.py"}
    return {"deepspeed.json": _dump(doc), "deepspeed_parts.py": DEEPSPEED_SNIPPET}


WRITERS: dict[str, Callable[..., dict[str, str]]] = {
    "torch": lambda plan, units, mbs: torch_files(plan, units),
    "torchtitan": torchtitan_files,
    "megatron": lambda plan, units, mbs: megatron_files(plan, units),
    "deepspeed": lambda plan, units, mbs: deepspeed_files(plan, units),
}


def export_files(plan: Plan, target: str, units: Units | None, micro_batch_size: int = 1) -> dict[str, str]:
    """The files `target` reads for `plan` (ExportError when it cannot run it)."""
    if target not in WRITERS:
        raise ExportError(f"target={target!r} has no export; use one of {', '.join(EXPORT_TARGETS)}")
    return WRITERS[target](plan, units, micro_batch_size)


def runnable_by(plan: Plan, units: Units | None) -> dict[str, str]:
    """Per stack, '' when it runs `plan` as it is, else why not."""
    out = {}
    for name in EXPORT_TARGETS:
        bad = [unsupported(TARGETS[name], units)] if unsupported(TARGETS[name], units) else []
        bad = bad or violations(plan, TARGETS[name], units)
        out[name] = bad[0] if bad else ""
    return out
