"""The solver comparison experiment: every formulation and baseline on the same instances.

Instances are real model presets (analytic costs) on a homogeneous and a heterogeneous cluster
preset, split into 4–32 stages. Two problems are solved:

- *fixed placement* (stage s on device s mod pp): DP (where each device holds one stage),
  brute force (where at most 50 000 partitions exist), greedy, greedy + local search, the
  presolved partition ILP and the plain partition ILP;
- *joint partition + placement* (each device holds n_stages/pp stages, any map): the joint ILP,
  on instances up to `joint_max_stages`.

For each result: objective (bottleneck seconds per micro-batch), gap to the best known optimum
of its problem (and, for the joint problem, to the fixed-placement optimum: what freeing the
placement gains), solve time, proven optimality, memory fit. Output: a rich table, rows in
`results.csv`, `summary.json` and `solve_time.png` (solve time against instance size). On a
terminal a progress bar shows the case being run and an estimate of the time left.

    python -m solvers.compare [--small] [--solver cbc|highs] [--out DIR]
"""
from __future__ import annotations

import argparse
import csv
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from math import comb
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from octopipe.cluster import Cluster
from octopipe.cluster_presets import cluster_from_config
from octopipe.config.cost import AnalyticCost
from octopipe.config.presets import preset
from octopipe.cost.analytic import analytic_costs
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError, InfeasibleError, OctoPipeError
from octopipe.io import write_json
from octopipe.model.build import build_model
from octopipe.progress import WeightedStep, weighted_progress
from octopipe.report.figures import pyplot, save
from octopipe.schedule.table import loop_placement
from solvers.backend import SolverConfig
from solvers.brute import brute_force_partition
from solvers.dp import dp_partition
from solvers.greedy import greedy_partition, improve_by_shifts
from solvers.instance import Inflight, PartitionInstance
from solvers.partition_ilp import solve_instance
from solvers.partition_result import PartitionResult
from solvers.placement_ilp import solve_placement_instance

BRUTE_MAX = 50_000          # partitions brute force may enumerate in the comparison


@dataclass(frozen=True)
class InstanceSet:
    """Which instances the comparison builds, and the limits of its slower methods.

    Every model on every cluster split into each stage count; the joint ILP runs up to
    `joint_max_stages` stages, the plain partition ILP within `plain_time_limit_s`.
    """

    models: tuple[str, ...]
    clusters: tuple[str, ...]
    stages: tuple[int, ...]
    microbatches: int
    joint_max_stages: int
    plain_time_limit_s: float

    def with_overrides(self, overrides: Mapping[str, Any] | None) -> InstanceSet:
        """This set with the fields named in `overrides` replaced (sequences become tuples)."""
        over = dict(overrides or {})
        known = {f.name: f for f in fields(self)}
        unknown = sorted(set(over) - set(known))
        if unknown:
            raise ConfigError(f"solver.compare has no option {', '.join(unknown)}; choose from "
                              f"{', '.join(known)}")
        cast = {"microbatches": int, "joint_max_stages": int, "plain_time_limit_s": float}
        return replace(self, **{k: (tuple(v) if isinstance(v, (list, tuple)) else
                                    cast[k](v) if k in cast else v) for k, v in over.items()})


FULL = InstanceSet(models=("nemotron_h_8b", "llama3_8b", "qwen2_vl_7b", "qwen3_30b_a3b"),
                   clusters=("h100_4x8", "hetero_a100_h100"), stages=(4, 8, 16, 32),
                   microbatches=16, joint_max_stages=8, plain_time_limit_s=20.0)
SMALL = InstanceSet(models=("tiny_hybrid",), clusters=("h100_1x8", "hetero_a100_h100"),
                    stages=(2, 4), microbatches=4, joint_max_stages=4, plain_time_limit_s=5.0)


@dataclass(frozen=True)
class Instance:
    model: str
    cluster: str
    n_stages: int
    pp: int
    inst: PartitionInstance

    @property
    def label(self) -> str:
        return f"{self.model}/{self.cluster}/S{self.n_stages}"

    @property
    def size(self) -> int:
        return self.inst.n_layers * self.n_stages


def preset_costs(model: str, cluster: str, pp: int | None) -> tuple[Cluster, CostTable]:
    """The cluster preset as `pp` ranks and the analytic costs of the model preset on it."""
    cl = cluster_from_config(preset("cluster", cluster), pp=pp)
    return cl, analytic_costs(AnalyticCost(), build_model(preset("model", model)), cl)


def build_instances(instances: InstanceSet) -> list[Instance]:
    """Every (model, cluster, stage count); pp = the cluster's devices up to the stage count."""
    microbatches = instances.microbatches
    out = []
    for model in instances.models:
        for cluster in instances.clusters:
            n_dev = cluster_from_config(preset("cluster", cluster)).n_devices
            for S in instances.stages:
                pp = min(S, n_dev)
                while S % pp:
                    pp -= 1
                chunks = S // pp
                cl, costs = preset_costs(model, cluster, pp)
                if costs.n_layers < S:
                    continue
                schedule = "1f1b" if chunks == 1 else "interleaved"
                inst = PartitionInstance.build(costs, cl, S, loop_placement(pp, chunks),
                                               Inflight(schedule, microbatches, chunks))
                out.append(Instance(model, cluster, S, pp, inst))
    return out


def _run(name: str, fn) -> PartitionResult:
    t0 = time.perf_counter()
    try:
        return fn()
    except InfeasibleError as e:
        return PartitionResult((), (), float("inf"), (), (), False, False, time.perf_counter() - t0,
                               name, status="infeasible", meta={"error": str(e)})


def solve_all(item: Instance, cfg: SolverConfig, joint_max_stages: int,
              plain_time_limit_s: float) -> list[tuple[str, PartitionResult]]:
    """(problem, result) for every method that applies to the instance."""
    inst = item.inst
    plain_cfg = replace(cfg, time_limit_s=min(cfg.time_limit_s, plain_time_limit_s))
    res: list[tuple[str, PartitionResult]] = []
    if len(set(inst.placement)) == len(inst.placement):
        res.append(("fixed", dp_partition(inst)))
    if comb(inst.n_layers - 1, inst.n_stages - 1) <= BRUTE_MAX:
        res.append(("fixed", brute_force_partition(inst)))
    g = greedy_partition(inst)
    res.append(("fixed", g))
    res.append(("fixed", improve_by_shifts(inst, g)))
    res.append(("fixed", _run(f"ilp_{cfg.name}", lambda: solve_instance(inst, cfg))))
    res.append(("fixed", _run(f"ilp_plain_{cfg.name}",
                              lambda: solve_instance(inst, plain_cfg, presolve=False))))
    if item.n_stages <= joint_max_stages:
        free = replace(inst, placement=())
        res.append(("joint", _run(f"joint_ilp_{cfg.name}",
                                  lambda: solve_placement_instance(free, plain_cfg))))
    return res


def compare_solvers(instances: InstanceSet, cfg: SolverConfig, log=print,
                    progress: WeightedStep | None = None) -> list[dict]:
    """Rows of the comparison (one per instance and method), gaps filled in.

    `progress` hears of each case before it runs, weighted by instance size (layers x stages).
    """
    rows: list[dict] = []
    items = build_instances(instances)
    total, done = float(sum(item.size for item in items)), 0.0
    for item in items:
        if progress is not None:
            progress(item.label, done, total)
        results = solve_all(item, cfg, instances.joint_max_stages, instances.plain_time_limit_s)
        fixed_best = None
        for problem in ("fixed", "joint"):
            mine = [r for p, r in results if p == problem]
            ok = [r for r in mine if r.fits_memory and np.isfinite(r.objective)]
            proven = [r.objective for r in ok if r.proven_optimal]
            best = min(proven) if proven else (min(r.objective for r in ok) if ok else None)
            if problem == "fixed":
                fixed_best = best
            for r in mine:
                good = r.fits_memory and np.isfinite(r.objective)
                gap = (r.objective / best - 1.0) if best and good else None
                vs_fixed = (r.objective / fixed_best - 1.0) if fixed_best and good else None
                rows.append({"instance": item.label, "model": item.model, "cluster": item.cluster,
                             "n_layers": item.inst.n_layers, "n_stages": item.n_stages,
                             "pp": item.pp, "size": item.size, "problem": problem,
                             "method": r.method, "status": r.status,
                             "objective_s": r.objective if np.isfinite(r.objective) else None,
                             "best_known_s": best, "gap": gap, "gap_vs_fixed_optimum": vs_fixed,
                             "solve_time_s": r.solve_time_s,
                             "proven_optimal": bool(r.proven_optimal and r.status != "infeasible"),
                             "fits_memory": r.fits_memory, "n_variables": r.n_variables,
                             "n_constraints": r.n_constraints})
        log(f"  {item.label}: " + ", ".join(f"{r.method} {r.solve_time_s:.2f}s" for _, r in results))
        done += item.size
    if progress is not None:
        progress("done", done, total)
    return rows


def summarize_methods(rows: list[dict]) -> dict:
    """Per method: instances, mean/max solve time, proven-optimal count, mean/max gap."""
    out: dict[str, dict] = {}
    for m in sorted({r["method"] for r in rows}):
        mine = [r for r in rows if r["method"] == m]
        gaps = [r["gap"] for r in mine if r["gap"] is not None]
        times = [r["solve_time_s"] for r in mine]
        out[m] = {"instances": len(mine), "proven_optimal": sum(r["proven_optimal"] for r in mine),
                  "infeasible": sum(r["status"] == "infeasible" for r in mine),
                  "mean_solve_time_s": float(np.mean(times)), "max_solve_time_s": float(np.max(times)),
                  "mean_gap": float(np.mean(gaps)) if gaps else None,
                  "max_gap": float(np.max(gaps)) if gaps else None}
    return out


def tables(rows: list[dict], summary: dict) -> tuple[Table, Table]:
    """The results table and the per-method table."""
    t = Table(title="solver comparison (objective = bottleneck device time per micro-batch)")
    for col in ("instance", "problem", "method", "objective ms", "gap", "time s", "proven", "fits"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["instance"], r["problem"], r["method"],
                  "-" if r["objective_s"] is None else f"{1e3 * r['objective_s']:.5g}",
                  "-" if r["gap"] is None else f"{100 * r['gap']:.2f}%", f"{r['solve_time_s']:.3f}",
                  "yes" if r["proven_optimal"] else "no", "yes" if r["fits_memory"] else r["status"])
    s = Table(title="per method")
    for col in ("method", "instances", "proven", "infeasible", "mean time s", "max time s",
                "mean gap", "max gap"):
        s.add_column(col)
    for m, v in summary.items():
        s.add_row(m, str(v["instances"]), str(v["proven_optimal"]), str(v["infeasible"]),
                  f"{v['mean_solve_time_s']:.3f}", f"{v['max_solve_time_s']:.3f}",
                  "-" if v["mean_gap"] is None else f"{100 * v['mean_gap']:.2f}%",
                  "-" if v["max_gap"] is None else f"{100 * v['max_gap']:.2f}%")
    return t, s


def print_table(rows: list[dict], summary: dict) -> None:
    con = Console(width=160)
    for t in tables(rows, summary):
        con.print(t)


def plot_solve_times(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for m in sorted({r["method"] for r in rows}):
        pts = sorted((r["size"], max(r["solve_time_s"], 1e-5)) for r in rows if r["method"] == m)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", ms=5, label=m, alpha=0.75)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("instance size (layers × stages)")
    ax.set_ylabel("solve time (s)")
    ax.set_title("partitioning solvers: solve time vs instance size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path, dpi=120)


def run_experiment(out_dir: Path, cfg: SolverConfig, small: bool = False,
                   overrides: Mapping[str, Any] | None = None, log=print,
                   progress: WeightedStep | None = None) -> dict:
    """Run, print, and write results.csv, summary.json and solve_time.png into `out_dir`.

    Without `progress`, a progress bar shows the case being run when stdout is a terminal.
    """
    instances = (SMALL if small else FULL).with_overrides(overrides)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with weighted_progress("solvers", show=False if progress else None) as bar:
        rows = compare_solvers(instances, cfg, log=log, progress=progress or bar)
    if not rows:
        raise OctoPipeError("the comparison has no instance: every stage count exceeds the models' layers")
    summary = summarize_methods(rows)
    print_table(rows, summary)
    with open(out_dir / "results.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plot_solve_times(rows, out_dir / "solve_time.png")
    doc = {"solver": cfg.name, "time_limit_s": cfg.time_limit_s, "small": small,
           "n_instances": len({r["instance"] for r in rows}), "n_results": len(rows),
           "wall_time_s": time.perf_counter() - t0, "methods": summary, "rows": rows,
           "options": {k: list(v) if isinstance(v, tuple) else v
                       for k, v in asdict(instances).items()}}
    write_json(out_dir / "summary.json", doc)
    return doc


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m solvers.compare", description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny instances (a quick smoke run)")
    ap.add_argument("--solver", default="cbc", choices=("cbc", "highs"))
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--out", type=Path, default=Path("runs/compare_solvers"))
    ap.add_argument("--models", nargs="*")
    ap.add_argument("--stages", nargs="*", type=int)
    args = ap.parse_args(argv)
    over = {k: tuple(v) for k, v in (("models", args.models), ("stages", args.stages)) if v}
    doc = run_experiment(args.out, SolverConfig(args.solver, args.time_limit), args.small, over)
    print(f"results: {args.out}")
    return doc


if __name__ == "__main__":
    main()
