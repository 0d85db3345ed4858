"""Full evaluation of a plan: the communication-aware simulator, then the safety checks.

The tuner ranks with its list-scheduling estimate; every plan it reports or writes is timed here
by `octopipe.sim` (strict row order under the runtime's communication semantics) and must pass
two checks: the simulated peak memory of every device is within its capacity, and the SMT check
(`solvers`) proves the lowered table free of deadlock under those semantics.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from octopipe.errors import DeadlockError
from octopipe.plan import Plan
from octopipe.schedule.lower import lower
from octopipe.sim.sim_result import SimResult
from octopipe.sim.simulator import simulate
from octopipe.tune.attribution import Attribution, attribute_sim
from octopipe.tune.candidate import Problem
from solvers.smt import check_deadlock_free


@dataclass
class Evaluated:
    """A plan with its simulated figures (or why it could not be used)."""

    name: str
    group: str                       # "uniform", "balanced" or "octopipe"
    plan: Plan | None
    sim: SimResult | None = None
    feasible: bool = False
    note: str = ""
    checks: dict = field(default_factory=dict)

    @property
    def makespan_s(self) -> float:
        return float(self.sim.makespan) if self.sim is not None else float("inf")

    def attribution(self) -> Attribution:
        return attribute_sim(self.sim)

    def row(self, tokens_per_iteration: float) -> dict:
        """Figures for tables and summary.json."""
        if self.sim is None:
            return {"name": self.name, "group": self.group, "feasible": False, "note": self.note}
        s = self.sim
        return {"name": self.name, "group": self.group, "feasible": self.feasible, "note": self.note,
                "makespan_s": float(s.makespan),
                "throughput_tokens_per_s": tokens_per_iteration / s.makespan if s.makespan > 0 else 0.0,
                "bubble_ratio": float(s.bubble_ratio),
                "peak_memory_bytes": float(np.max(s.peak_memory)),
                "n_stages": len(self.plan.partition) if self.plan else 0}


def simulate_plan(problem: Problem, plan: Plan) -> SimResult:
    """The simulator's strict-order run of `plan` under the problem's communication semantics."""
    return simulate(plan, problem.costs, problem.cluster, policy="strict", semantics=problem.semantics)


def evaluate(problem: Problem, name: str, group: str, plan: Plan) -> Evaluated:
    """Simulate `plan`; it is feasible when it runs without deadlock and fits every device.

    Under rendezvous or batched semantics the table is first lowered (explicit SEND/RECV cells
    in torch's order): with implicit transfers placed next to their computes, a blocking send
    deadlocks most schedules, while the lowered order is what a fixed-order runtime executes.
    """
    if problem.semantics != "eager" and not plan.table.is_lowered:
        plan = replace(plan, table=lower(plan.table))
    try:
        sim = simulate_plan(problem, plan)
    except DeadlockError as e:
        return Evaluated(name, group, plan, None, False, f"deadlock: {str(e).splitlines()[0]}")
    over = problem.over_memory(sim.peak_memory, sim.peak_activation_memory)
    if over:
        return Evaluated(name, group, plan, sim, False, over[0])
    return Evaluated(name, group, plan, sim, True)


def smt_check(problem: Problem, plan: Plan, max_actions: int) -> dict:
    """SMT deadlock-freedom of the lowered table under the problem's semantics.

    Returns {"smt": "proved" | "skipped", ...}; raises DeadlockError (with the counterexample)
    when a deadlock is found.
    Tables above `max_actions` compute actions are checked by the simulator's deadlock
    detection only (the formulation grows with the table), and the report says so.
    """
    n = sum(1 for _ in plan.table)
    if n > max_actions:
        return {"smt": "skipped", "reason": f"{n} actions > tuner.smt_max_actions={max_actions}; "
                "the simulator ran the table to completion without deadlock"}
    verdict = check_deadlock_free(plan.table, semantics=problem.semantics)
    if not verdict.ok:
        raise DeadlockError(f"SMT check: the plan deadlocks under {problem.semantics} semantics\n"
                            f"{verdict.report()}")
    return {"smt": "proved", "smt_seconds": verdict.solve_time_s, "smt_events": verdict.n_events}


def safe(problem: Problem, ev: Evaluated, max_actions: int) -> Evaluated:
    """Run the SMT check on a feasible evaluation; a failure makes it infeasible."""
    if not ev.feasible:
        return ev
    try:
        ev.checks = smt_check(problem, ev.plan, max_actions)
        ev.checks["memory"] = "fits"
    except DeadlockError as e:
        ev.feasible = False
        ev.note = str(e).splitlines()[0]
    return ev
