"""What each stack keeps of OctoPipe's speedup: per preset and pipeline size, the plan each target
runs beside OctoPipe's free plan and the target's own best named schedule, with the exported files
read back by the stack's own code.

`python -m octopipe.measure.bench.targets` (`--quick`: llama3_8b at pp = 4 only) writes
runs/bench/targets/results.json and table.md. Analytic H100 costs, the default tuner, the
simulator's makespans; a row's check is what the stack's parser or validator said of the export.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from octopipe.cluster_presets import cluster_from_config
from octopipe.config.cluster import ClusterConfig
from octopipe.config.cost import AnalyticCost
from octopipe.config.presets import preset
from octopipe.cost.sources import cost_table
from octopipe.errors import InfeasibleError
from octopipe.interop.compare import rule_costs
from octopipe.interop.export import export_files
from octopipe.interop.target_plan import TargetCase, plan_target
from octopipe.interop.targets import TARGETS
from octopipe.interop.units import preset_units
from octopipe.interop.validate import stack_accepts
from octopipe.io import write_text
from octopipe.model.build import build_model
from octopipe.tune import TuneOptions, tune
from octopipe.tune.splitting import model_splitter

CASES = (("llama3_8b", 4), ("llama3_8b", 8), ("nemotron_h_8b", 4), ("nemotron_h_8b", 8))
STACKS = ("torch", "torchtitan", "megatron", "deepspeed")
MICROBATCHES = 16


@dataclass(frozen=True)
class Row:
    model: str
    pp: int
    target: str
    target_s: float | None
    free_s: float
    best_named: str | None
    best_named_s: float | None
    layout: str
    costliest_rule: str | None
    costliest_lifted_s: float | None
    check: str
    seconds: float


def run_case(model_name: str, pp: int, microbatches: int = MICROBATCHES) -> list[Row]:
    model = build_model(preset("model", model_name))
    cluster = cluster_from_config(ClusterConfig(), pp=pp, tp=1)
    cost = AnalyticCost()
    costs = cost_table(cost, model, cluster)
    options = TuneOptions(model=model_name, splitter=model_splitter(model, lambda m: cost_table(cost, m, cluster)))
    free_s = tune(costs, cluster, pp, microbatches, options).makespan_s
    case = TargetCase(costs, preset_units(model), cluster, pp, microbatches, options)
    rows = []
    for name in STACKS:
        t0 = time.perf_counter()
        try:
            tp = plan_target(TARGETS[name], case)
        except InfeasibleError as e:
            rows.append(Row(model_name, pp, name, None, free_s, None, None, "", None, None,
                            f"no plan fits: {str(e).splitlines()[0]}", time.perf_counter() - t0))
            continue
        rc = rule_costs(TARGETS[name], case, tp, free_s)
        base = tp.best_baseline()
        files = export_files(tp.best.plan, name, case.units, model.micro_batch_size)
        try:
            check = stack_accepts(name, files, microbatches, case.units.n_units)
        except Exception as e:        # the stack's own refusal is the figure this bench reports
            check = f"REFUSED: {type(e).__name__}: {e}"
        style, v = tp.layout
        rule = rc.costliest()
        rows.append(Row(model_name, pp, name, tp.makespan_s, rc.free_s, base.name if base else None,
                        base.makespan_s if base else None, f"{style} x{v}" if v else style, rule,
                        rc.lifted_s.get(rule) if rule else None, check, time.perf_counter() - t0))
    # one free figure per case: the fastest plan any search found without a stack's rules
    free = min([free_s] + [r.free_s for r in rows])
    return [replace(r, free_s=free) for r in rows]


def table_md(rows: list[Row]) -> str:
    lines = ["| model | pp | target | target plan (s) | free plan (s) | target / free | stack's best named "
             "schedule | its s | target speedup | layout | costliest rule (s without it) | stack's check |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.target_s is None:
            lines.append(f"| {r.model} | {r.pp} | {r.target} | — | {r.free_s:.3f} | — | — | — | — | — | — "
                         f"| {r.check} |")
            continue
        speed = f"{r.best_named_s / r.target_s:.3f}×" if r.best_named_s else "—"
        rule = f"{r.costliest_rule} ({r.costliest_lifted_s:.3f})" if r.costliest_rule else "—"
        lines.append(f"| {r.model} | {r.pp} | {r.target} | {r.target_s:.3f} | {r.free_s:.3f} | "
                     f"{r.target_s / r.free_s:.3f} | {r.best_named or '—'} | "
                     f"{r.best_named_s or float('nan'):.3f} | {speed} | {r.layout} | {rule} | {r.check} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="llama3_8b at pp = 4 only")
    ap.add_argument("--out", default="runs/bench/targets")
    args = ap.parse_args(argv)
    rows: list[Row] = []
    for model_name, pp in CASES[:1] if args.quick else CASES:
        for r in run_case(model_name, pp):    # printed per case, once its free figure is known
            print(f"{r.model:14s} pp={r.pp} {r.target:10s} target {r.target_s or float('nan'):7.3f} s  "
                  f"free {r.free_s:7.3f} s  named {r.best_named_s or float('nan'):7.3f} s ({r.best_named})  "
                  f"{r.layout:8s} costliest {r.costliest_rule}  check: {r.check}  [{r.seconds:.0f} s]", flush=True)
            rows.append(r)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "results.json", json.dumps([asdict(r) for r in rows], indent=1))
    write_text(out / "table.md", table_md(rows))
    slower = [r for r in rows if r.target_s is not None and r.best_named_s is not None
              and r.target_s > r.best_named_s * (1 + 1e-9)]
    refused = [r for r in rows if r.check.startswith("REFUSED")]
    print(f"{len(rows)} rows; slower than the stack's best named schedule: {len(slower)}; refused by the "
          f"stack's own check: {len(refused)}; wrote {out}/results.json and table.md")
    return 1 if slower or refused else 0


if __name__ == "__main__":
    raise SystemExit(main())
