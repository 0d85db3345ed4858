"""What `mode=plan target=...` adds to the plan: the target's own plan beside OctoPipe's, the
cost of each of its rules, and the files its stack reads (`export/`)."""
from __future__ import annotations

from pathlib import Path

from rich.table import Table

from octopipe.errors import ConfigError
from octopipe.interop.compare import rule_costs
from octopipe.interop.export import EXPORT_TARGETS, ExportError, export_files, runnable_by
from octopipe.interop.target_plan import TargetCase, TargetPlan, plan_target
from octopipe.interop.targets import target_named
from octopipe.interop.units import Units, block_units, hf_names, preset_units, sequential_names
from octopipe.modes.inputs import Inputs
from octopipe.modes.mode_result import Artifact
from octopipe.plan import Plan
from octopipe.tune import TuneOptions

GIB = 2.0 ** 30


def units_of(inputs: Inputs) -> Units | None:
    """The modules the stacks know this model by (None: costs that do not follow its layers)."""
    cfg, model = inputs.config, inputs.costed_model
    if cfg.model.factory:
        return block_units(sequential_names(model.n_layers), "the factory's nn.Sequential")
    if cfg.model.hf:
        return block_units(hf_names(model.n_layers), "transformers")
    try:
        return preset_units(model)
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


def case_of(inputs: Inputs, options: TuneOptions) -> TargetCase:
    cfg = inputs.config
    return TargetCase(inputs.costs, units_of(inputs), inputs.cluster, cfg.pp, cfg.microbatches, options)


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
        lines.append("Stacks that cannot run this plan as it is (plan with target=<stack> for one they can): "
                     + "; ".join(f"{k}: {v}" for k, v in why.items()))
    return arts, lines
