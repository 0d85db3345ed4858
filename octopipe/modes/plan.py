"""`mode=plan` (the default): ILP → bubble-aware tuner → SMT check, against the baselines.

Reports the comparison a newcomer needs (each baseline at its best memory-feasible setting
against the OctoPipe plan: iteration time, throughput, bubble ratio, peak memory, speedup),
with plan.json, schedule.csv, trace.json, timeline.png, history.json and report.md as its
artifacts; the figures become summary.json.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from rich.table import Table

from octopipe.config.schema import Config
from octopipe.cost.table import CostTable
from octopipe.errors import InfeasibleError
from octopipe.interop.target_plan import check_target
from octopipe.interop.targets import target_named
from octopipe.model.spec import ModelSpec
from octopipe.modes.artifacts import compact_json_artifact, json_artifact, plan_artifacts, text_artifact
from octopipe.modes.inputs import Inputs
from octopipe.modes.mode_result import Artifact, Result
from octopipe.modes.targeting import case_of, free_exports, target_result, tune_options
from octopipe.plan import Plan, plan_model
from octopipe.runtime.dispatch import variability_for
from octopipe.schedule.render import bars_trace
from octopipe.sim.variability import Variability
from octopipe.tune import TuneOptions, tune
from octopipe.tune.report_md import plan_report, plan_timeline_png, sim_bars

GIB = 2.0 ** 30


def _why(name: str, attr, makespan: float) -> str:
    """One line: how much of the device-time idles, and why (bubble attribution)."""
    tot = attr.totals()
    dev_time = makespan * len(attr.busy)
    parts = ", ".join(f"{k} {v / dev_time:.1%}" for k, v in tot.items() if v / dev_time >= 0.001)
    return f"  {name}: devices idle {attr.idle.sum() / dev_time:.1%} of the time ({parts or 'none'})"


def plan_variability(cfg: Config, model: ModelSpec, costs: CostTable) -> Callable[[Plan], Variability] | None:
    """For tuner.objective=mean|quantile: the variability the run will see (`sim.jitter_cv` or
    `runtime.jitter_cv`, and `runtime.*`'s stragglers, slow rank, message delays, sequence
    lengths and images per sample), bound to a plan's stages as the runtime binds it."""
    if cfg.tuner.objective == "nominal":
        return None
    config = replace(cfg.runtime, jitter_cv=max(cfg.sim.jitter_cv, cfg.runtime.jitter_cv))
    return lambda plan: variability_for(config, plan_model(model, plan), None if plan.pieces else costs,
                                        plan.partition)


def run(inputs: Inputs) -> Result:
    cfg = inputs.config
    model, cluster, costs = inputs.model, inputs.cluster, inputs.costs
    pp, mb = cfg.pp, cfg.microbatches
    report: list = [f"[bold]OctoPipe plan[/]: {model.name} ({model.n_layers} layers) on {pp} × "
                    f"{cluster.kind_of(0).name} ({cluster.name}), {mb} micro-batches of "
                    f"{costs.tokens_per_microbatch} tokens"]
    case = {"model": model.name, "cluster": cluster.name, "pp": pp, "microbatches": mb,
            "seq_len": int(model.seq_len)}
    options = tune_options(inputs, plan_variability(cfg, model, costs))
    if cfg.target != "octopipe":       # what the target cannot run is refused before any search
        check_target(target_named(cfg.target), case_of(inputs, options))
    try:
        res = tune(costs, cluster, pp, mb, options)
    except InfeasibleError as e:
        if not (cfg.experiment is not None and cfg.experiment.keep_going):
            raise
        report.append(f"[yellow]infeasible[/]: {e}")
        return Result({"status": "infeasible", "reason": str(e).splitlines()[0], **case},
                      tuple(report))
    summary = res.summary()
    tokens = res.tokens_per_iteration
    if cfg.target != "octopipe":
        return _for_target(inputs, options, res, case, report)

    table = Table(title=f"{model.name}, pp={pp}, {mb} micro-batches "
                        f"(lower bound {res.lower_bound_s * 1e3:.1f} ms)")
    for col in ("schedule", "partition", "iter ms", "tokens/s", "bubble", "peak GiB",
                "OctoPipe ×"):
        table.add_column(col, justify="left" if col in ("schedule", "partition") else "right",
                         no_wrap=True)
    for b in res.baselines:
        r = b.row(tokens)
        if not b.feasible:
            table.add_row(b.name, b.group, "—", "—", "—", "—", f"[dim]{b.note}[/]")
            continue
        table.add_row(b.name, b.group, f"{r['makespan_s'] * 1e3:.1f}", f"{r['throughput_tokens_per_s']:,.0f}",
                      f"{r['bubble_ratio']:.1%}", f"{r['peak_memory_bytes'] / GIB:.1f}",
                      f"{res.speedup_vs(b):.2f}×")
    table.add_row("[bold]OctoPipe[/]", "tuned", f"[bold]{res.makespan_s * 1e3:.1f}[/]",
                  f"[bold]{summary['throughput_tokens_per_s']:,.0f}[/]", f"{summary['bubble_ratio']:.1%}",
                  f"{summary['peak_memory_bytes'] / GIB:.1f}", "1.00×")
    report.append(table)
    best_ev = res.best_baseline()
    if best_ev is not None:
        report.append(_why(best_ev.name, best_ev.attribution(), best_ev.sim.makespan))
    report.append(_why("OctoPipe", res.attribution, res.makespan_s))
    report.append(f"OctoPipe: {res.versus_text()}; {summary['efficiency_vs_lower_bound']:.1%} of the lower bound "
                  f"(total work / devices); plan: {res.plan.meta.get('candidate', res.plan.meta.get('origin'))}; "
                  f"tuned in {res.tuner_seconds:.1f} s; checks: memory fits, deadlock "
                  f"{res.evaluated.checks.get('smt', '?')}")
    if res.piece_text():
        report.append(f"Layers split so that no device waits on one heavy layer: {res.piece_text()}")

    title = (f"OctoPipe plan: {model.name}, pp={pp}, {mb} micro-batches, "
             f"{res.makespan_s * 1e3:.1f} ms, bubble {summary['bubble_ratio']:.1%}")
    artifacts = (*plan_artifacts(res.plan),
                 compact_json_artifact("trace.json", bars_trace(sim_bars(res.sim_result))),
                 Artifact("timeline.png", lambda path: plan_timeline_png(path, res.sim_result, title)),
                 json_artifact("history.json", {"history": res.history, "search": res.search_stats,
                                                "ilp": res.ilp}),
                 text_artifact("report.md", plan_report(res, model.name, cluster.name, pp, mb)))
    exports, lines = free_exports(inputs, res.plan)
    report.extend(lines)
    summary["baselines"] = [b.row(tokens) for b in res.baselines]
    summary["ilp"] = res.ilp
    summary["target"] = "octopipe"
    summary["export"] = [a.name for a in exports]
    return Result({"status": "ok", **case, **summary}, tuple(report), (*artifacts, *exports))


def _for_target(inputs: Inputs, options: TuneOptions, res, case: dict, report: list) -> Result:
    """mode=plan target=<stack>: the stack's best plan is the run's plan; OctoPipe's own plan
    (free of the stack's rules) is reported beside it and kept as free_plan.json."""
    figures, lines, arts, plan = target_result(inputs, options, res.makespan_s)
    report.extend(lines)
    free = {k: v for k, v in res.summary().items() if k in (
        "makespan_s", "bubble_ratio", "peak_memory_bytes", "n_stages", "placement", "split_layers",
        "best_baseline", "speedup_vs_best_baseline")}
    title = f"{inputs.config.target} plan: {case['model']}, pp={case['pp']}, {case['microbatches']} micro-batches"
    artifacts = (*plan_artifacts(plan), *plan_artifacts(res.plan, "free_plan.json", "free_schedule.csv"),
                 text_artifact("report.md", f"# {title}\n\n{figures['target_note']}\n"), *arts)
    return Result({"status": "ok", **case, **figures, "free": free}, tuple(report), artifacts)
