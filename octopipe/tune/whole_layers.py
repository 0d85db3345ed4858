"""A search over whole layers beside the search over pieces.

Cutting heavy layers into pieces widens the search space, and with the same budget the search
over pieces can end in a slower plan than a search that cuts nothing (llama3_8b, pp = 8, 32
micro-batches: 3.658 s with pieces, 3.613 s without). So when the planner cuts layers, the search
over whole layers runs too, with the same budgets and starts as `tuner.split_layers=off` (the
ILPs' partitions aside), and its best plans join the finalists: the plan chosen is not slower
than what that search finds. A quarter of the budget was not enough on that case (3.638 s).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from octopipe.config.tuner import TunerConfig
from octopipe.errors import InfeasibleError
from octopipe.plan import Plan
from octopipe.tune.baselines import as_candidate
from octopipe.tune.candidate import Problem
from octopipe.tune.evaluate import Evaluated
from octopipe.tune.freeze import to_plan
from octopipe.tune.levers import Levers, reference
from octopipe.tune.search import SearchConfig, search

SHARE = 1          # the whole-layer search gets 1/SHARE of the search's budgets


def whole_layer_plans(whole: Problem, baselines: Sequence[Evaluated], cfg: TunerConfig,
                      seed: int, left_s: float, model: str = "") -> list[Plan]:
    """The best distinct whole-layer plans (up to half the finalists) of a search with the same
    budgets, from the feasible baselines and S-1F1B."""
    levers = Levers.of([x for x in cfg.levers if x != "split_layers"], reference(whole.n_layers, whole.n_devices))
    scfg = replace(SearchConfig.of(cfg), max_evaluations=max(1, cfg.max_evaluations // SHARE),
                   max_work=max(1, cfg.max_work // SHARE), time_budget_s=left_s)
    starts = [as_candidate(b) for b in baselines if b.feasible and levers.conforms(as_candidate(b))]
    try:
        out = search(whole, [*starts, levers.ref], scfg, seed, pool_size=max(2, cfg.finalists), levers=levers)
    except InfeasibleError:     # nothing fits over whole layers: the pieces' finalists stand
        return []
    finals, seen = [], set()
    for est, cand in out.pool:
        if len(finals) >= max(1, cfg.finalists // 2):
            break
        plan = levers.frozen_table(to_plan(whole, cand, model=model,
                                           meta={"origin": f"tuned over whole layers from {cand.origin or 'seed'}",
                                                 "estimate_s": est, "candidate": cand.describe()}))
        key = (plan.partition, plan.table.rows)
        if key not in seen:
            seen.add(key)
            finals.append(plan)
    return finals
