"""Plans that stay fast when times vary: finalists scored by Monte Carlo simulation.

With `tuner.objective=mean` (or `quantile`, at `tuner.quantile`) the finalists the nominal search
leaves, and variants of them that help under variability (more micro-batches in flight, the
backward split so that W can fill late gaps), are simulated `tuner.samples` times under the
variability model the simulator and the runtime share (`octopipe.sim.variability.Variability`:
per-action jitter, stragglers, a slow rank, sequence lengths), with the dispatch policy the run
will use (`tuner.dispatch`; under ready_first every hint is tried and the best is kept). Every
candidate sees the same draws (common random numbers: sample k is seeded (seed, k) for all), so
score differences are the plans', not the noise's; the same seed gives the same plan.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from octopipe.errors import InfeasibleError, OctoPipeError
from octopipe.plan import Plan
from octopipe.sim.durations import Durations
from octopipe.sim.simulator import ReadyFirst, Simulator
from octopipe.sim.variability import Variability
from octopipe.tune.candidate import Problem
from octopipe.tune.evaluate import Evaluated, evaluate
from octopipe.tune.freeze import candidate_of, to_plan

HINTS = ("table", "bf", "bfw")
INFLIGHT = (1.5, 2.0)          # variants: this many times the nominal plan's forwards in flight


@dataclass(frozen=True)
class Robust:
    """How finalists are scored: `objective` (mean | quantile at `quantile`) over `samples`
    simulations under `variability(plan)` (bound to the plan's stages), dispatched by
    `dispatch` (strict | ready_first), seeded by `seed`."""

    objective: str
    quantile: float
    samples: int
    dispatch: str
    variability: Callable[[Plan], Variability]
    seed: int = 0
    semantics: str = "eager"

    def spans(self, problem: Problem, plan: Plan, hint: str = "table") -> np.ndarray:
        """Makespans of the `samples` draws (the same draws for every plan)."""
        sim = Simulator(plan, problem.costs, problem.cluster)
        return np.array([self._run(sim, plan, hint, (self.seed, k)) for k in range(self.samples)])

    def drawn(self, sim: Simulator, plan: Plan, seed) -> Durations:
        """`sim`'s durations of `plan` under the draws of `seed` (what the runtime draws for an
        iteration seeded so)."""
        var = self.variability(plan)
        return var.apply(sim.program, sim.durations, np.random.default_rng(seed)) if var.active else sim.durations

    def span_of(self, sim: Simulator, plan: Plan, hint: str, seed, host_s: float = 0.0) -> float:
        """One makespan on the draws of `seed`, every action `host_s` longer (a runtime's host
        time per action, which the costs do not hold)."""
        dur = self.drawn(sim, plan, seed)
        return float(sim.run(dur.scaled(compute=dur.compute + host_s), policy=self._policy(hint),
                             semantics=self.semantics).makespan)

    def _policy(self, hint: str):
        return ReadyFirst(hint) if self.dispatch == "ready_first" else "strict"

    def _run(self, sim: Simulator, plan: Plan, hint: str, seed) -> float:
        return float(sim.run(policy=self._policy(hint), semantics=self.semantics, jitter=self.variability(plan),
                             seed=np.random.default_rng(seed)).makespan)

    def score(self, spans: np.ndarray) -> float:
        return float(spans.mean() if self.objective == "mean" else np.quantile(spans, self.quantile))

    def best_hint(self, problem: Problem, plan: Plan) -> tuple[float, str]:
        """The plan's score and the hint that gives it (strict dispatch: the table's order)."""
        hints = HINTS if self.dispatch == "ready_first" else ("table",)
        scored = []
        for h in hints:
            if h == "bfw" and not plan.table.splits_backward:
                continue
            scored.append((self.score(self.spans(problem, plan, h)), h))
        return min(scored)


def variants(problem: Problem, ev: Evaluated) -> list[Evaluated]:
    """Feasible plans near a tuned finalist that may hold up better when times vary: more
    forwards in flight (slack before the bottleneck), and the backward split (W fills gaps)."""
    plan = ev.plan
    if plan.policy is None or plan.table.is_lowered:
        return []
    base = candidate_of(plan, plan.policy)
    out = []
    for cand in [replace(base, inflight=base.inflight * k) for k in INFLIGHT] + (
            [] if base.split_backward else [replace(base, split_backward=True)]):
        try:
            new = to_plan(problem, cand, model=plan.model, pieces=plan.pieces,
                          meta={**plan.meta, "robust_variant": cand.describe()})
        except (InfeasibleError, OctoPipeError):
            continue
        e = evaluate(problem, "OctoPipe", "octopipe", new)
        if e.feasible:
            out.append(e)
    return out


def robust_rank(finals: Sequence[Evaluated], problem_of: Callable[[Plan], Problem], robust: Robust,
                top: int) -> tuple[list[Evaluated], dict]:
    """The finalists re-ranked by their score (the `top` feasible ones and their variants first),
    and the record: each scored plan's nominal and robust figures, and the nominal choice's."""
    feasible = [e for e in finals if e.feasible][:top]
    pool = list(feasible)
    for e in feasible:
        pool += variants(problem_of(e.plan), e)
    scored = []
    for k, e in enumerate(pool):
        s, hint = robust.best_hint(problem_of(e.plan), e.plan)
        plan = replace(e.plan, meta={**e.plan.meta, "robust": {"objective": robust.objective, "score_s": s,
                                                               "hint": hint, "dispatch": robust.dispatch}})
        scored.append((s, k, replace(e, plan=plan)))
    nominal_s = scored[0][0] if scored else None           # pool[0]: the nominal ranking's best
    scored.sort(key=lambda t: (t[0], t[1]))
    best = scored[0] if scored else None
    record = {"objective": robust.objective, "quantile": robust.quantile, "samples": robust.samples,
              "dispatch": robust.dispatch, "candidates": len(scored), "nominal_choice_score_s": nominal_s,
              "score_s": best[0] if best else None, "hint": best[2].plan.meta["robust"]["hint"] if best else None}
    return [e for _, _, e in scored] + [e for e in finals if e not in feasible], record
