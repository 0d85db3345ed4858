"""`mode=solvers`: the solver comparison experiment (see `solvers.compare`).

Runs every partitioning formulation and baseline on the same instances with the MILP backend of
`solver=` (cbc, highs; Hydra sweeps `-m solver=cbc,highs` work); reports the tables, with
results.csv and solve_time.png as artifacts. `solver.compare.small=true` runs tiny instances;
`solver.compare.{models,clusters,stages}` choose the instance set.
"""
from __future__ import annotations

import csv
import time
from pathlib import Path

from octopipe.errors import OctoPipeError
from octopipe.modes.inputs import Inputs
from octopipe.modes.mode_result import Artifact, Result
from octopipe.progress import weighted_progress
from solvers.compare import FULL, SMALL, compare_solvers, plot_solve_times, summarize_methods, tables


def _write_rows(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def run(inputs: Inputs) -> Result:
    solver = inputs.config.solver
    options = solver.compare
    chosen = {k: getattr(options, k) for k in ("models", "clusters", "stages", "joint_max_stages",
                                                "plain_time_limit_s") if getattr(options, k) is not None}
    instances = (SMALL if options.small else FULL).with_overrides(chosen)
    t0 = time.perf_counter()
    with weighted_progress("solvers", show=inputs.interactive) as bar:
        rows = compare_solvers(instances, solver, log=(lambda line: None) if inputs.interactive else inputs.progress,
                       progress=bar)
    if not rows:
        raise OctoPipeError("the comparison has no instance: every stage count exceeds the models' layers")
    methods = summarize_methods(rows)
    summary = {"solver": solver.name, "n_instances": len({r["instance"] for r in rows}),
               "n_results": len(rows), "wall_time_s": time.perf_counter() - t0, "methods": methods,
               "rows": rows, "results_csv": "results.csv", "plot_png": "solve_time.png"}
    return Result(summary, tables(rows, methods),
                  (Artifact("results.csv", lambda path: _write_rows(path, rows)),
                   Artifact("solve_time.png", lambda path: plot_solve_times(rows, path))))
