"""A target's plan beside OctoPipe's own: what the stack's rules cost, measured by lifting each
rule in turn and planning again (the figures `mode=plan target=...` reports)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from octopipe.errors import InfeasibleError
from octopipe.interop.target_plan import TargetCase, TargetPlan, plan_target
from octopipe.interop.targets import Target


@dataclass(frozen=True)
class RuleCosts:
    """Per rule of the target, the makespan with that rule lifted (None: still no plan)."""

    target: Target
    target_s: float
    free_s: float
    lifted_s: dict[str, float | None]

    def costliest(self) -> str | None:
        """The rule whose lifting shortens the plan most (None: lifting none shortens it)."""
        ok = {r: s for r, s in self.lifted_s.items() if s is not None and s < self.target_s * (1 - 1e-9)}
        return min(ok, key=ok.get) if ok else None

    def sentence(self) -> str:
        t = self.target
        gap = self.target_s / self.free_s - 1.0
        words = (f"{t.stack} runs its best plan in {self.target_s:.4g} s; OctoPipe's own plan takes "
                 f"{self.free_s:.4g} s, so the target leaves {gap:.1%} on the table")
        rule = self.costliest()
        if rule is None or gap <= 0:
            return words + "."
        lifted = self.lifted_s[rule]
        return (words + f"; its costliest rule is {t.rule_text(rule)}: without it the plan would take "
                f"{lifted:.4g} s ({self.target_s / lifted - 1.0:.1%} faster).")

    def as_dict(self) -> dict:
        return dict(self.lifted_s)


def rule_costs(target: Target, case: TargetCase, result: TargetPlan, free_s: float,
               progress: Callable[[str], None] = lambda _: None) -> RuleCosts:
    """Plan again with each of the target's rules lifted alone (a lifted granularity that allows
    pieces is OctoPipe's own plan, `free_s`)."""
    lifted: dict[str, float | None] = {}
    for rule in target.rules():
        relaxed = target.relax(rule)
        if relaxed.granularity == "pieces":
            lifted[rule] = free_s
            continue
        progress(f"{target.name} without the {rule} rule")
        try:
            lifted[rule] = min(plan_target(relaxed, case).makespan_s, result.makespan_s)
        except InfeasibleError:
            lifted[rule] = None
    # every plan found with fewer rules is a plan free of the stack's rules: the free figure is the
    # fastest of them, so that the target never appears faster than the unconstrained plan
    found = [s for s in lifted.values() if s is not None]
    return RuleCosts(target, result.makespan_s, min(free_s, result.makespan_s, *found), lifted)
