"""MILP backends: CBC (PuLP's `COIN_CMD`) by default, HiGHS where `highspy` is installed.

`SolverConfig` (octopipe.config.solver: fields, docs, defaults and ranges of `conf/solver/*.yaml`)
chooses the backend; `make_solver` turns it into a PuLP solver object and
`run_model` solves a PuLP problem and reports status, bound and time in one value.
"""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, replace
from typing import Any

import pulp

from octopipe.config.solver import SolverConfig
from octopipe.errors import SolverUnavailableError


def highs_available() -> bool:
    try:
        import highspy  # noqa: F401  (only whether it imports)
    except ImportError:
        return False
    return True


def cbc_path() -> str:
    """The CBC executable: the one PuLP 3 ships (the binary the ILPs were always solved with),
    else a `cbc` on PATH (`pip install pulp[cbc]` installs one)."""
    bundled = getattr(getattr(pulp.apis, "coin_api", None), "pulp_cbc_path", None)
    if bundled and os.access(bundled, os.X_OK):
        return bundled
    found = shutil.which("cbc")
    if found is None:
        raise SolverUnavailableError("solver=cbc needs the CBC executable, which was not found: "
                                     "run `pip install pulp[cbc]`, or use solver=highs")
    return found


def cbc(**options: Any) -> pulp.COIN_CMD:
    """CBC through PuLP's `COIN_CMD` with `options` (msg, timeLimit, gapRel, threads, ...)."""
    return pulp.COIN_CMD(path=cbc_path(), **options)


def make_solver(cfg: SolverConfig) -> pulp.LpSolver:
    """The PuLP solver object for `cfg`; SolverUnavailableError if HiGHS is asked for but absent."""
    if cfg.name == "cbc":
        # one thread: CBC's serial branch and bound; its threaded one with -threads 1 parks a
        # worker in a timed wait that the main thread joins, stalling a solve for seconds
        threads = None if cfg.threads == 1 else cfg.threads
        return cbc(msg=cfg.msg, timeLimit=cfg.time_limit_s, gapRel=cfg.gap, threads=threads,
                   options=list(cfg.cbc_options), maxNodes=cfg.max_nodes)
    if not highs_available():
        raise SolverUnavailableError("solver=highs needs the HiGHS Python bindings, which are not "
                                     "installed: run `pip install highspy` (or `pip install "
                                     "octopipe[highs]`), or use solver=cbc")
    nodes = {} if cfg.max_nodes is None else {"mip_max_nodes": cfg.max_nodes}
    return pulp.HiGHS(msg=cfg.msg, timeLimit=cfg.time_limit_s, gapRel=cfg.gap, threads=cfg.threads,
                      **nodes)


@dataclass(frozen=True)
class SolveOutcome:
    """What a backend reported: PuLP status text, objective and best bound, time, optimality."""

    status: str
    objective: float | None
    bound: float | None
    solve_time_s: float
    proven_optimal: bool
    has_solution: bool
    time_capped: bool = False        # stopped by the time limit (the result depends on the machine)


def run_model(prob: pulp.LpProblem, cfg: SolverConfig) -> SolveOutcome:
    """Solve `prob`; proven optimality means status Optimal with gap 0 within the time limit (a
    solve stopped by `cfg.max_nodes` reports its incumbent, unproven)."""
    solver = make_solver(cfg)
    t0 = time.perf_counter()
    try:
        prob.solve(solver)
    except pulp.PulpSolverError:
        if cfg.name != "cbc" or not cfg.cbc_options:
            raise
        # CBC 2.10 with "preprocess off" exits without writing a solution on some models whose
        # LP relaxation is feasible but which have no integer solution; its defaults report them
        solver = make_solver(replace(cfg, cbc_options=()))
        prob.solve(solver)
    dt = time.perf_counter() - t0
    status = pulp.LpStatus[prob.status]
    sol_status = prob.sol_status
    has_solution = sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    objective = pulp.value(prob.objective) if has_solution else None
    proven = (sol_status == pulp.LpSolutionOptimal and cfg.gap == 0.0
              and dt < cfg.time_limit_s * 0.999)
    bound = _best_bound(prob, solver, objective if proven else None)
    return SolveOutcome(status, objective, bound, dt, proven, has_solution,
                        not proven and dt >= cfg.time_limit_s * 0.999)


def _best_bound(prob: pulp.LpProblem, solver: pulp.LpSolver, proven_obj: float | None) -> float | None:
    if proven_obj is not None:
        return proven_obj
    if isinstance(solver, pulp.HiGHS) and getattr(prob, "solverModel", None) is not None:
        try:
            return float(prob.solverModel.getInfo().mip_dual_bound)
        except Exception:
            return None
    return None
