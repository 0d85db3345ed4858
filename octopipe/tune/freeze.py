"""Freeze a candidate's executed order into a ScheduleTable and a Plan."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from octopipe.errors import InfeasibleError
from octopipe.plan import Plan
from octopipe.schedule.action import Action, B, F, I, W
from octopipe.schedule.table import ScheduleTable
from octopipe.tune.candidate import Candidate, Problem
from octopipe.tune.listsched import ListResult


def to_table(cand: Candidate, result: ListResult, n_devices: int, n_microbatches: int,
             name: str = "octopipe") -> ScheduleTable:
    """Per device, the actions in the order the list scheduler started them."""
    if not result.complete:
        raise InfeasibleError(f"candidate ({cand.describe()}) does not complete: its in-flight "
                              "limits or memory capacity leave every device waiting")
    M = n_microbatches
    kinds = (F, I, W) if cand.split_backward else (F, B, W)
    rows: list[list[Action]] = [[] for _ in range(n_devices)]
    for aid in result.order.tolist():
        m = aid % M
        sk = aid // M
        s, k = divmod(sk, 3)
        rows[cand.placement[s]].append(Action(s, kinds[k], m))
    return ScheduleTable(tuple(tuple(r) for r in rows), cand.placement, M, name)


def to_plan(problem: Problem, cand: Candidate, result: ListResult | None = None,
            model: str = "", meta: dict | None = None, shards: Mapping[int, int] | None = None) -> Plan:
    """The candidate's frozen table as a plan; `shards`: the layers the problem's model split."""
    result = result if result is not None else problem.estimate(cand)
    table = to_table(cand, result, problem.n_devices, problem.n_microbatches)
    meta = dict(meta or {})
    meta.setdefault("policy", {"split_backward": cand.split_backward, "inflight": _num(cand.inflight),
                               "kind_rank": list(cand.kind_rank), "f_tiebreak": cand.f_tiebreak,
                               "b_tiebreak": cand.b_tiebreak, "w_pressure": cand.w_pressure})
    return Plan(cand.partition, table, model=model, cluster=problem.cluster.name, meta=meta,
                shards=shards or {})


def _num(x: float):
    return None if not np.isfinite(x) else float(x)
