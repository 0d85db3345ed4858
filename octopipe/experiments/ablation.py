"""`experiment=ablation`: what each tuner lever buys alone and together.

For every model (heterogeneous presets on analytic costs, and the OctoPipe authors' published
profiles) the tuner runs once per non-empty subset of `tuner.levers` (partition, placement,
schedule, split_layers); a lever left out stays at S-1F1B's value (`octopipe.tune.levers`), and
only baselines that keep it there compete with the subset's plan. The figure of a subset is the
speedup of its plan over the best of all baselines, so a subset can land below 1: tuning one
lever alone can hurt against a baseline that already pulls another one.

Full co-optimization is never worse than any subset by construction: it runs last, with every
subset's plan handed to it as a finalist (`TuneOptions.plans`), on the same deterministic
budgets. Outputs: ablation.csv, ablation.png (speedup per subset and model), report.md with one
sentence per model on what the pattern shows.
"""
from __future__ import annotations

import csv
import io
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from octopipe.cluster import Cluster
from octopipe.cluster_presets import cluster_from_config
from octopipe.config.cost import AnalyticCost
from octopipe.config.experiment import AblationExperiment
from octopipe.config.presets import preset
from octopipe.config.tuner import LEVERS, TunerConfig
from octopipe.cost.from_file import ProfileOptions, profile_cost_table
from octopipe.cost.profile_format import load_preset
from octopipe.cost.sources import cost_table
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.experiments.octopipe_authors import split_shares
from octopipe.model.build import build_model
from octopipe.modes.artifacts import json_artifact, text_artifact
from octopipe.modes.inputs import Inputs, splitter_for
from octopipe.modes.mode_result import Artifact, Result
from octopipe.progress import track_cases
from octopipe.report.figures import pyplot, save
from octopipe.tune import TuneOptions, tune
from octopipe.tune.splitting import LayerSplitter, row_splitter

FULL = tuple(LEVERS)


def subsets() -> list[tuple[str, ...]]:
    """Every non-empty subset of the levers, smallest first, the full set last."""
    return [s for r in range(1, len(LEVERS) + 1) for s in itertools.combinations(LEVERS, r)]


@dataclass(frozen=True)
class Workload:
    """One model's costs on the cluster, and how its layers may split."""

    name: str
    source: str                  # "preset" | "profile"
    costs: CostTable
    cluster: Cluster
    splitter: LayerSplitter | None


@dataclass(frozen=True)
class Row:
    model: str
    source: str
    levers: tuple[str, ...]
    makespan_s: float
    best_baseline: str
    speedup: float               # over the best of all baselines
    tuner_s: float
    stopped_by: str

    @property
    def label(self) -> str:
        return "+".join(self.levers)


def workloads(exp: AblationExperiment, inputs: Inputs) -> list[Workload]:
    """The presets on analytic costs and the profiles, each on the run's cluster (`devices`)."""
    cfg = inputs.config
    cluster = cluster_from_config(cfg.cluster, pp=exp.devices, tp=1)
    out = []
    for name in exp.models:
        model = build_model(preset("model", name))
        cost = cfg.cost if isinstance(cfg.cost, AnalyticCost) else AnalyticCost()
        costs = cost_table(cost, model, cluster)
        out.append(Workload(name, "preset", costs, cluster, splitter_for(cost, model, cluster, costs)))
    for name in exp.profiles:
        prof = load_preset(name)
        costs = profile_cost_table(prof, ProfileOptions(), tuple(k.name for k in cluster.kinds))
        ok, fixed = split_shares(prof, costs)
        out.append(Workload(name, "profile", costs, cluster, row_splitter(costs, ok, fixed)))
    return out


def run_workload(w: Workload, exp: AblationExperiment, tuner: TunerConfig, seed: int) -> list[Row]:
    """Every subset on one workload; the full set last, seeded with every subset's plan."""
    rows, plans = [], []
    for levers in subsets():
        cfg = replace(tuner, levers=levers, max_evaluations=exp.max_evaluations)
        t0 = time.perf_counter()
        res = tune(w.costs, w.cluster, exp.devices, exp.microbatches, TuneOptions(
            cfg, seed=seed, model=w.name, splitter=w.splitter,
            plans=plans if levers == FULL else ()))
        plans.append(res.plan)
        best = res.best_baseline()
        rows.append(Row(w.name, w.source, levers, res.makespan_s, best.name if best else "",
                        res.speedup_vs(best) or 0.0, time.perf_counter() - t0,
                        res.search_stats["stopped_by"]))
    return rows


def sentence(rows: Sequence[Row]) -> str:
    """What one model's pattern shows, in one sentence."""
    by = {r.levers: r for r in rows}
    full = by[FULL]
    singles = [by[(x,)] for x in LEVERS]
    best1 = max(singles, key=lambda r: r.speedup)
    hurt = [r.label for r in singles if r.speedup < 0.995]
    best_part = max((r for r in rows if r.levers != FULL), key=lambda r: r.speedup)
    s = (f"{full.model}: co-optimizing all levers gives {full.speedup:.2f}x over the best baseline "
         f"({full.best_baseline}); the best single lever, {best1.label}, gives {best1.speedup:.2f}x")
    s += (f", and {', '.join(hurt)} alone {'fall' if len(hurt) > 1 else 'falls'} below the best "
          "baseline (by more than 0.5%)" if hurt else
          ", and no single lever falls more than 0.5% below the best baseline")
    if best_part.speedup >= full.speedup * (1 - 1e-9):
        s += f"; {best_part.label} already reaches the full plan"
    else:
        s += f"; the best partial subset ({best_part.label}) reaches {best_part.speedup:.2f}x"
    return s + "."


def table_csv(rows: Sequence[Row]) -> str:
    buf = io.StringIO()
    wr = csv.writer(buf)
    wr.writerow(["model", "source", "levers", "makespan_ms", "best_baseline", "speedup",
                 "tuner_s", "stopped_by"])
    for r in rows:
        wr.writerow([r.model, r.source, r.label, f"{r.makespan_s * 1e3:.3f}", r.best_baseline,
                     f"{r.speedup:.4f}", f"{r.tuner_s:.1f}", r.stopped_by])
    return buf.getvalue()


def plot(rows: Sequence[Row], path) -> None:
    plt = pyplot()

    models = list(dict.fromkeys(r.model for r in rows))
    labels = ["+".join(s) for s in subsets()]
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(labels)), 4.5))
    width = 0.8 / max(1, len(models))
    for k, m in enumerate(models):
        vals = {r.label: r.speedup for r in rows if r.model == m}
        ax.bar([i + k * width for i in range(len(labels))], [vals.get(x, 0.0) for x in labels],
               width, label=m)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))])
    ax.set_xticklabels([x.replace("split_layers", "split").replace("+", "+\n") for x in labels],
                       fontsize=7)
    ax.set_ylabel("speedup over the best baseline")
    ax.set_title("tuner levers: alone and together")
    ax.legend(fontsize=7)
    save(fig, path, dpi=120)


def report_md(rows: Sequence[Row], exp: AblationExperiment, wall_s: float) -> str:
    models = list(dict.fromkeys(r.model for r in rows))
    lines = [f"# experiment=ablation: {exp.devices} devices, {exp.microbatches} micro-batches", "",
             f"Every subset of the levers, tuner.max_evaluations={exp.max_evaluations} each; "
             f"{wall_s:.0f} s in all. Speedup over the best of all baselines (a lever left out "
             "stays at S-1F1B's value).", "",
             "| levers | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
    for s in subsets():
        vals = {r.model: r.speedup for r in rows if r.levers == s}
        lines.append(f"| {'+'.join(s)} | " + " | ".join(f"{vals[m]:.3f}" for m in models) + " |")
    lines += ["", *(f"- {sentence([r for r in rows if r.model == m])}" for m in models), ""]
    return "\n".join(lines)


def run(inputs: Inputs) -> Result:
    exp = inputs.config.experiment
    if not isinstance(exp, AblationExperiment):
        raise ConfigError(f"the ablation driver runs experiment=ablation, not "
                          f"experiment={getattr(exp, 'name', None)}")
    if not exp.models and not exp.profiles:
        raise ConfigError("experiment.models and experiment.profiles are both empty: the ablation would run "
                          "nothing; name at least one model preset or profile")
    t0 = time.perf_counter()
    rows: list[Row] = []
    for w in track_cases(workloads(exp, inputs), "ablation", describe=lambda w: w.name):
        rows += run_workload(w, exp, inputs.config.tuner, inputs.config.seed)
    wall = time.perf_counter() - t0
    models = list(dict.fromkeys(r.model for r in rows))
    full_never_worse = all(
        next(r for r in rows if r.model == m and r.levers == FULL).makespan_s
        <= min(r.makespan_s for r in rows if r.model == m) * (1 + 1e-12) for m in models)
    summary = {"experiment": "ablation", "wall_s": wall, "full_never_worse": full_never_worse,
               "rows": [{"model": r.model, "source": r.source, "levers": list(r.levers),
                         "makespan_s": r.makespan_s, "best_baseline": r.best_baseline,
                         "speedup": r.speedup, "tuner_s": r.tuner_s, "stopped_by": r.stopped_by}
                        for r in rows],
               "sentences": {m: sentence([r for r in rows if r.model == m]) for m in models}}
    md = report_md(rows, exp, wall)
    items = (md, f"full co-optimization never worse than any subset: {full_never_worse}")
    arts = (text_artifact("ablation.csv", table_csv(rows)), text_artifact("report.md", md),
            Artifact("ablation.png", lambda path: plot(rows, path)),
            json_artifact("rows.json", summary["rows"]))
    return Result(summary, items, arts)
