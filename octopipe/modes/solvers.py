"""`mode=solvers`: the solver comparison experiment (see `solvers.compare`).

Runs every partitioning formulation and baseline on the same instances with the MILP backend of
`solver=` (cbc, highs; Hydra sweeps `-m solver=cbc,highs` work), prints the table and writes
results.csv, solve_time.png and summary.json. `solver.compare.small=true` runs tiny instances;
`solver.compare.{models,clusters,stages}` choose the instance set.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from solvers.backend import SolverConfig
from solvers.compare import run_experiment


def run(cfg: Any, out_dir: Path) -> dict:
    solver_cfg = SolverConfig.from_cfg(cfg.get("solver"))
    opts = OmegaConf.select(cfg, "solver.compare", default=None)
    opts = OmegaConf.to_container(opts) if opts is not None else {}
    small = bool(opts.pop("small", False))
    overrides = {k: (tuple(v) if isinstance(v, list) else v) for k, v in opts.items() if v is not None}
    doc = run_experiment(out_dir, solver_cfg, small, overrides)
    best = {m: v for m, v in doc["methods"].items()}
    return {"solver": doc["solver"], "n_instances": doc["n_instances"], "n_results": doc["n_results"],
            "wall_time_s": doc["wall_time_s"], "methods": best, "rows": doc["rows"],
            "results_csv": str(out_dir / "results.csv"), "plot_png": str(out_dir / "solve_time.png")}
