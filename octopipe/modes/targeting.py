"""What `mode=plan target=...` adds to the plan: the target's own plan beside OctoPipe's, the
cost of each of its rules, and the files its stack reads (`export/`)."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from rich.table import Table

from octopipe.errors import ConfigError, InfeasibleError, ScheduleError
from octopipe.interop.compare import rule_costs
from octopipe.interop.export import EXPORT_TARGETS, ExportError, export_files, runnable_by
from octopipe.interop.imports import (
    from_deepspeed_parts,
    from_fqns,
    from_hybrid_pattern,
    from_megatron_layout,
)
from octopipe.interop.target_plan import TargetCase, TargetPlan, plan_target
from octopipe.interop.targets import target_named
from octopipe.interop.units import Units, block_units, hf_names, preset_units, sequential_names
from octopipe.modes.inputs import Inputs
from octopipe.modes.mode_result import Artifact
from octopipe.plan import Plan
from octopipe.plan_io import load_schedule_file
from octopipe.schedule.library import build_schedule
from octopipe.schedule.table import ScheduleTable
from octopipe.tune import TuneOptions, tune

GIB = 2.0 ** 30


def units_of(inputs: Inputs, n_blocks: int | None = None) -> Units | None:
    """The modules the stacks know this model by (None: costs that do not follow its layers).
    A user's model (model=module, model=hf) has one module per block: `n_blocks` of them (a
    plan's layer count: such models are planned by mode=train, which profiles the blocks)."""
    cfg = inputs.config
    if cfg.model.factory or cfg.model.hf:
        if n_blocks is None:
            raise ConfigError(f"model={cfg.model.name}: a user's model is planned by mode=train; export its "
                              "plan.json with mode=export")
        names = sequential_names(n_blocks) if cfg.model.factory else hf_names(n_blocks)
        return block_units(names, "the factory's nn.Sequential" if cfg.model.factory else "transformers")
    try:
        return preset_units(inputs.costed_model)
    except ConfigError:
        return None


def export_artifacts(plan: Plan, targets: tuple[str, ...], units: Units | None,
                     micro_batch_size: int) -> tuple[list[Artifact], dict[str, str]]:
    """`export/<file>` artifacts for each of `targets` that runs `plan`, and why the others do not."""
    arts, why = [], {}
    for name in targets:
        try:
            files = export_files(plan, name, units, micro_batch_size)
        except ExportError as e:
            why[name] = str(e)
            continue
        arts += [_export_artifact(fname, text) for fname, text in files.items()]
    return arts, why


def _export_artifact(name: str, text: str) -> Artifact:
    def write(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return Artifact(f"export/{name}", write)


def tune_options(inputs: Inputs, variability=None) -> TuneOptions:
    """The tuner's options of a run, from its config (mode=plan's, and the comparisons')."""
    cfg = inputs.config
    return TuneOptions(cfg.tuner, cfg.solver, semantics=cfg.sim.semantics, seed=cfg.seed, model=inputs.model.name,
                       progress=inputs.interactive, splitter=inputs.splitter, variability=variability)


def case_of(inputs: Inputs, options: TuneOptions) -> TargetCase:
    cfg = inputs.config
    return TargetCase(inputs.costs, units_of(inputs), inputs.cluster, cfg.pp, cfg.microbatches, options,
                      cfg.chunks)


def target_result(inputs: Inputs, options: TuneOptions, free_s: float) -> tuple[dict, list, list[Artifact], Plan]:
    """The target's plan, its figures for summary.json, its report lines and its export files."""
    cfg = inputs.config
    target = target_named(cfg.target)
    case = case_of(inputs, options)
    tp = plan_target(target, case, inputs.progress)
    costs = rule_costs(target, case, tp, free_s, inputs.progress)
    tokens = cfg.microbatches * float(inputs.costs.tokens_per_microbatch)
    base = tp.best_baseline()
    style, v = tp.layout
    figures = {"target": target.name, "target_stack": target.stack,
               **{k: val for k, val in tp.best.row(tokens).items() if k not in ("name", "group", "note")},
               "free_makespan_s": costs.free_s,
               "target_vs_free": costs.target_s / costs.free_s,
               "target_best_baseline": base.name if base else None,
               "target_speedup_vs_best_baseline": base.makespan_s / tp.makespan_s if base else None,
               "target_layout": {"placement": style, "stages_per_rank": v,
                                 "schedule": target.schedule_for(v) or "table (CSV)"},
               "rule_costs_s": costs.as_dict(), "costliest_rule": costs.costliest(),
               "target_note": costs.sentence(),
               "target_baselines": [b.row(tokens) for b in tp.baselines],
               "layouts_tried": list(tp.tried)}
    arts, _ = export_artifacts(tp.best.plan, (target.name,), case.units, inputs.model.micro_batch_size)
    figures["export"] = [a.name for a in arts]
    return figures, _report(tp, costs.sentence(), tokens), arts, tp.best.plan


def _report(tp: TargetPlan, sentence: str, tokens: float) -> list:
    t = Table(title=f"target={tp.target.name}: {tp.target.stack}")
    for col in ("plan", "iter ms", "bubble", "peak GiB", "×"):
        t.add_column(col, justify="left" if col == "plan" else "right", no_wrap=True)
    rows = sorted(tp.baselines, key=lambda b: (not b.feasible, b.makespan_s))[:6]
    for ev in (*rows, tp.best):
        r = ev.row(tokens)
        if not ev.feasible:
            t.add_row(ev.name, "—", "—", "—", f"[dim]{ev.note}[/]")
            continue
        t.add_row(ev.name, f"{r['makespan_s'] * 1e3:.1f}", f"{r['bubble_ratio']:.1%}",
                  f"{r['peak_memory_bytes'] / GIB:.1f}", f"{ev.makespan_s / tp.makespan_s:.2f}×")
    return [t, sentence]


def free_exports(inputs: Inputs, plan: Plan) -> tuple[list[Artifact], list[str]]:
    """For target=octopipe: the files of every stack that runs OctoPipe's plan as it is, and a
    line naming the ones that cannot and why."""
    units = units_of(inputs)
    arts, _ = export_artifacts(plan, EXPORT_TARGETS, units, inputs.model.micro_batch_size)
    why = {k: v for k, v in runnable_by(plan, units).items() if v}
    lines = []
    if why:
        reasons = set(why.values())
        said = (f"{', '.join(why)}: {reasons.pop()}" if len(reasons) == 1
                else "; ".join(f"{k}: {v}" for k, v in why.items()))
        lines.append(f"Stacks that cannot run this plan as it is ({said}); plan with target=<stack> for a plan "
                     "they run (docs/interop.md)")
    return arts, lines


def imported_plan(inputs: Inputs) -> Plan:
    """The plan of the stack configuration `schedule.*` gives (a Megatron layout or hybrid
    pattern, torchtitan's module lists with a schedule, DeepSpeed's parts)."""
    cfg = inputs.config
    sc, pp, m = cfg.schedule, cfg.pp, cfg.microbatches
    given = [k for k in ("megatron_layout", "hybrid_pattern", "torchtitan_fqns", "deepspeed_parts")
             if getattr(sc, k) is not None]
    if len(given) > 1:
        raise ConfigError(f"schedule: give one stack configuration, not {' and '.join(given)}")
    units = units_of(inputs)
    if units is None:
        raise ConfigError(f"schedule.{given[0]}: the costs do not follow the model's modules; use the "
                          "preset's own costs")
    if pp is None:
        raise ConfigError(f"schedule.{given[0]}: set pp (the pipeline ranks)")
    if sc.megatron_layout is not None:
        plan = from_megatron_layout(sc.megatron_layout, pp, m, units)
    elif sc.hybrid_pattern is not None:
        plan = from_hybrid_pattern(sc.hybrid_pattern, pp, m, units)
    elif sc.deepspeed_parts is not None:
        plan = from_deepspeed_parts(sc.deepspeed_parts, m, units)
        if plan.table.n_devices != pp:
            raise ConfigError(f"schedule.deepspeed_parts: {plan.table.n_devices} stages for pp={pp}; "
                              f"DeepSpeed runs one stage per rank: give {pp + 1} bounds or set "
                              f"pp={plan.table.n_devices}")
    else:
        plan = from_fqns(sc.torchtitan_fqns, _fqns_table(inputs, len(sc.torchtitan_fqns)), units)
    return replace(plan, model=inputs.model.name, cluster=inputs.cluster.name)


def _fqns_table(inputs: Inputs, n_parts: int) -> ScheduleTable:
    cfg = inputs.config
    if cfg.schedule.file:
        table = load_schedule_file(Path(cfg.schedule.file))
        if table.n_devices != cfg.pp:
            raise ConfigError(f"schedule.file has {table.n_devices} ranks but pp={cfg.pp}")
        return table
    if not cfg.schedule.name or n_parts % cfg.pp:
        raise ConfigError(f"schedule.torchtitan_fqns: {n_parts} parts over pp={cfg.pp} ranks need a "
                          "schedule=<name> with that many stages per rank, or schedule.file=CSV")
    try:
        return build_schedule(cfg.schedule.name, cfg.pp, cfg.microbatches, n_parts // cfg.pp)
    except ScheduleError as e:
        raise ConfigError(f"schedule.torchtitan_fqns with schedule={cfg.schedule.name}: {e}") from None


def import_comparison(inputs: Inputs, imported_s: float, stack: str) -> tuple[dict, list[str]]:
    """How much faster OctoPipe's plan for the stack, and its own free plan, would run than the
    imported configuration."""
    cfg = inputs.config
    options = replace(tune_options(inputs), progress=False)
    inputs.progress(f"planning for {stack} and without a stack's rules, to compare")
    out: dict = {"imported": stack, "imported_makespan_s": imported_s}
    lines = []
    try:
        tp = plan_target(target_named(stack), case_of(inputs, options))
        out["target_plan_makespan_s"] = tp.makespan_s
        out["target_plan_speedup"] = imported_s / tp.makespan_s
        lines.append(f"OctoPipe's plan for {stack} runs in {tp.makespan_s:.4g} s: "
                     f"{imported_s / tp.makespan_s:.2f}× this configuration")
    except InfeasibleError as e:
        out["target_plan_makespan_s"] = None
        lines.append(f"[yellow]no OctoPipe plan for {stack}[/]: {str(e).splitlines()[0]}")
    try:
        free = tune(inputs.costs, inputs.cluster, cfg.pp, cfg.microbatches, options)
        free_s = min(free.makespan_s, out.get("target_plan_makespan_s") or math.inf)
        out["free_makespan_s"] = free_s
        out["free_plan_speedup"] = imported_s / free_s
        lines.append(f"OctoPipe's own plan (no stack's rules) runs in {free_s:.4g} s: "
                     f"{imported_s / free_s:.2f}× this configuration")
    except InfeasibleError as e:
        out["free_makespan_s"] = None
        lines.append(f"[yellow]no OctoPipe plan fits[/]: {str(e).splitlines()[0]}")
    return out, lines
