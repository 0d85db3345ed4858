"""Row moves on a frozen table: advance an action into a bubble, judged by the full simulator.

The list scheduler never idles while one of its actions is ready, but it ranks without link
contention and with in-flight limits; the communication-aware simulation of the frozen table can
still show gaps. For each gap (largest first) this pass tries moving a later action of the same
row, one whose producers had finished before the gap opened, to the gap's position; a move is
kept when the simulated makespan drops and memory still fits. A move that deadlocks or
overflows is rolled back. The pass is budgeted in simulations (`max_sims`); the wall clock is
only a safety cap (`time_cap_s`), and the outcome says which one ended it.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from octopipe.config.solver import SolverConfig
from octopipe.cost.stage_costs import StageCosts
from octopipe.errors import DeadlockError, ScheduleError
from octopipe.plan import Plan
from octopipe.schedule.validate import data_predecessors
from octopipe.sim.sim_result import SimResult
from octopipe.tune.candidate import Problem
from octopipe.tune.evaluate import simulate_plan
from solvers.w_placement import WInstance, place_ws


def _gaps(sim: SimResult) -> list[tuple[float, int, int, float]]:
    """(length, device, row position of the action after the gap, gap start), largest first."""
    out = []
    for d, ids in enumerate(sim.order):
        if len(ids) < 2:
            continue
        st, en = sim.start[ids], sim.end[ids]
        g = st[1:] - en[:-1]
        for j in np.flatnonzero(g > 1e-12 * max(1.0, float(sim.makespan))):
            out.append((float(g[j]), d, int(j + 1), float(en[j])))
    out.sort(key=lambda t: -t[0])
    return out


def advance_into_bubbles(problem: Problem, plan: Plan, sim: SimResult, max_sims: int,
                         time_cap_s: float = float("inf"), max_gaps: int = 16,
                         tries_per_gap: int = 3) -> tuple[Plan, SimResult, list[str], str]:
    """Returns (plan, sim, accepted moves, stopped_by); never returns a slower or infeasible
    plan. stopped_by: `converged` (every gap tried), `iterations` (`max_sims` spent) or
    `time_cap`."""
    t0 = time.perf_counter()
    accepted: list[str] = []
    if any(a is None for row in plan.table.rows for a in row):
        return plan, sim, accepted, "converged"     # idle cells: row positions are not actions
    split = {(a.stage, a.microbatch) for _, a in plan.table if a.kind.value == "I"}
    S = plan.table.n_stages
    sims = 0
    for _, d, j, g0 in _gaps(sim)[:max_gaps]:
        end_of = {sim.program.action(int(c)): float(sim.end[c]) for c in range(sim.program.n_compute)}
        row = list(plan.table.rows[d])
        tried = 0
        for k in range(j + 1, len(row)):
            if tried >= tries_per_gap:
                break
            if sims >= max_sims:
                return plan, sim, accepted, "iterations"
            if time.perf_counter() - t0 > time_cap_s:
                return plan, sim, accepted, "time_cap"
            a = row[k]
            preds = data_predecessors(a, S, split)
            if any(end_of.get(p, np.inf) > g0 for p in preds) or any(p in row[j:k] for p in preds):
                continue
            tried += 1
            sims += 1
            new_row = row[:j] + [a] + row[j:k] + row[k + 1:]
            rows = list(plan.table.rows)
            rows[d] = tuple(new_row)
            cand = replace(plan, table=plan.table.with_rows(rows))
            try:
                new_sim = simulate_plan(problem, cand)
            except (DeadlockError, ScheduleError):
                continue
            fits = not problem.over_memory(new_sim.peak_memory, new_sim.peak_activation_memory)
            if fits and new_sim.makespan < sim.makespan * (1 - 1e-9):
                accepted.append(f"advance {a} on device {d} into the gap at {g0 * 1e3:.2f} ms")
                plan, sim = cand, new_sim
                break
    return plan, sim, accepted, "converged"


def w_instance(problem: Problem, plan: Plan) -> WInstance:
    """The plan's rows and stage costs as the W-placement ILP takes them; the budget is the
    tighter of the activation budget and what static memory leaves of each device."""
    st = StageCosts.bind(problem.costs, plan.partition, plan.table.placement, problem.kind_col)
    t = st.boundary_transfers(problem.cluster)
    budget = problem.memory_bytes - st.per_device(st.static_bytes, problem.n_devices)
    if problem.act_budget is not None:
        budget = np.minimum(budget, problem.act_budget)
    return WInstance(plan.table.rows, st.f, st.i, st.w, np.concatenate([t, [0.0]]),
                     np.concatenate([[0.0], t]), st.act_bytes, st.w_act_bytes, budget)


def place_ws_exactly(problem: Problem, plan: Plan, sim: SimResult, solver: SolverConfig
                     ) -> tuple[Plan, SimResult, str]:
    """The W-placement ILP (`solvers.w_placement`) on a split-backward plan: its rows with every W
    in the best gap for the fixed F/I order, kept when the simulator finds them faster and within
    memory. Returns (plan, sim, what happened)."""
    if not plan.table.splits_backward or plan.table.is_lowered:
        return plan, sim, "not split backward"
    res = place_ws(w_instance(problem, plan), solver)
    if res.time_capped:
        return plan, sim, "time_cap"
    if not np.isfinite(res.makespan):
        return plan, sim, f"ILP {res.status}"
    cand = replace(plan, table=plan.table.with_rows(res.rows))
    try:
        new_sim = simulate_plan(problem, cand)
    except (DeadlockError, ScheduleError):
        return plan, sim, "ILP rows deadlock"
    if (new_sim.makespan < sim.makespan * (1 - 1e-9)
            and not problem.over_memory(new_sim.peak_memory, new_sim.peak_activation_memory)):
        return cand, new_sim, f"W placement ILP ({'optimal' if res.proven_optimal else res.status})"
    return plan, sim, "ILP found no faster W placement"
