"""A configuration a user already runs, read as an OctoPipe plan so that it can be simulated and
compared: a Megatron layout string or hybrid pattern, a torchtitan `module_fqns_per_model_part`
list with its schedule, DeepSpeed `parts`. Each reader checks the configuration against the
model's modules (`Units`) and refuses in one line what the stack itself would refuse.
"""
from __future__ import annotations

from collections.abc import Sequence

from octopipe.errors import ConfigError
from octopipe.interop.megatron_layout import parse_layout, validate_layout
from octopipe.interop.targets import layout_of
from octopipe.interop.units import HYBRID_SYMBOLS, Units
from octopipe.plan import Partition, Plan
from octopipe.schedule.library import build_schedule
from octopipe.schedule.table import ScheduleTable

HYBRID_LETTERS = "".join(sorted(set(HYBRID_SYMBOLS.values())))


def _plan(units: Units, unit_sizes: Sequence[int], table: ScheduleTable, source: str) -> Plan:
    if any(n < 1 for n in unit_sizes):
        empty = [s for s, n in enumerate(unit_sizes) if n < 1]
        raise ConfigError(f"{source}: stage {empty[0]} holds no module; OctoPipe's plans need every stage "
                          "to hold at least one")
    return Plan(units.to_layers(Partition(tuple(unit_sizes))), table, meta={"source": source})


def _megatron_table(n_stages: int, pp: int, n_microbatches: int, field: str) -> ScheduleTable:
    if n_stages % pp:
        raise ConfigError(f"{field}: {n_stages} stages is not a multiple of pp={pp}")
    v = n_stages // pp
    return build_schedule("1f1b" if v == 1 else "interleaved", pp, n_microbatches, v)


def from_megatron_layout(text: str, pp: int, n_microbatches: int, units: Units) -> Plan:
    """`--pipeline-model-parallel-layout` over a preset's E / t / L modules."""
    field = "schedule.megatron_layout"
    if units.hybrid:
        raise ConfigError(f"{field}: {units.source} names a hybrid model; give schedule.hybrid_pattern")
    stages = parse_layout(text, field)
    if any("m" in s for s in stages):
        raise ConfigError(f"{field}: MTP layers (m) are not in OctoPipe's model; drop them")
    validate_layout(stages, pp, units.decoder_count, 0, field)
    return _plan(units, [len(s) for s in stages], _megatron_table(len(stages), pp, n_microbatches, field),
                 f"megatron layout {text!r}")


def from_hybrid_pattern(text: str, pp: int, n_microbatches: int, units: Units) -> Plan:
    """Megatron's `--hybrid-layer-pattern` with `|` stage bounds, over a hybrid preset's layers
    (the embedding joins the first stage, the head the last)."""
    field = "schedule.hybrid_pattern"
    if not units.hybrid:
        raise ConfigError(f"{field}: the model is not hybrid; give schedule.megatron_layout")
    for j, c in enumerate(text):
        if c not in HYBRID_LETTERS + "|":
            raise ConfigError(f"{field}={text!r}: position {j}: {c!r} is not a layer symbol "
                              f"({', '.join(HYBRID_LETTERS)}) or '|'")
    segments = text.split("|")
    want = "".join(units.symbols[1:-1])
    if text.replace("|", "") != want:
        raise ConfigError(f"{field}: the pattern's layers {text.replace('|', '')!r} are not the model's {want!r}")
    sizes = [len(s) for s in segments]
    sizes[0] += 1
    sizes[-1] += 1
    return _plan(units, sizes, _megatron_table(len(segments), pp, n_microbatches, field),
                 f"megatron hybrid pattern {text!r}")


def from_fqns(parts: Sequence[Sequence[str]], table: ScheduleTable, units: Units) -> Plan:
    """torchtitan's `module_fqns_per_model_part` with the table its schedule (or CSV) gives."""
    field = "schedule.torchtitan_fqns"
    owner = {n: u for u, names in enumerate(units.names) for n in names}
    seen: list[int] = []
    sizes = []
    for s, part in enumerate(parts):
        us = []
        for name in part:
            if name not in owner:
                known = ", ".join(n for names in units.names[:4] for n in names)
                raise ConfigError(f"{field}: part {s} names {name!r}, which is not a module of the model "
                                  f"({units.source} names: {known}, ...)")
            us.append(owner[name])
        us = sorted(set(us))
        if us and (us != list(range(us[0], us[-1] + 1)) or (seen and us[0] != seen[-1] + 1)):
            raise ConfigError(f"{field}: part {s} is not the modules right after part {s - 1}'s")
        seen += us
        sizes.append(len(us))
    if seen != list(range(units.n_units)):
        raise ConfigError(f"{field}: the parts cover {len(seen)} of the model's {units.n_units} modules")
    if len(parts) != table.n_stages:
        raise ConfigError(f"{field}: {len(parts)} parts but the schedule has {table.n_stages} stages")
    if layout_of(tuple(table.placement), table.n_devices) is None:
        raise ConfigError(f"{field}: torchtitan places stages in a loop or a V; the schedule's placement "
                          f"{list(table.placement)} is neither")
    return _plan(units, sizes, table, "torchtitan module_fqns_per_model_part")


def from_deepspeed_parts(parts: Sequence[int], n_microbatches: int, units: Units) -> Plan:
    """DeepSpeed `parts` (layer bounds of the PipelineModule, one stage per rank, 1F1B)."""
    field = "schedule.deepspeed_parts"
    parts = [int(x) for x in parts]
    if len(parts) < 2 or parts[0] != 0 or parts[-1] != units.n_units:
        raise ConfigError(f"{field}={parts}: bounds start at 0 and end at {units.n_units}, the model's module "
                          "count (embedding, decoder layers, head: the PipelineModule's layer list)")
    if any(b <= a for a, b in zip(parts, parts[1:])):
        raise ConfigError(f"{field}={parts}: bounds must increase")
    table = build_schedule("1f1b", len(parts) - 1, n_microbatches, 1)
    return _plan(units, [b - a for a, b in zip(parts, parts[1:])], table, f"deepspeed parts {parts}")
