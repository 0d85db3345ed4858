"""Freeze a candidate's executed order into a ScheduleTable and a Plan."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from octopipe.errors import InfeasibleError
from octopipe.plan import Plan, SchedulePolicy
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
    order = np.asarray(result.order, dtype=np.int64)
    stage, mb = np.divmod(order, M)
    stage, kind = np.divmod(stage, 3)
    dev = np.asarray(cand.placement, dtype=np.int64)[stage]
    by_dev = np.argsort(dev, kind="stable")          # each device's actions in start order
    cuts = np.searchsorted(dev[by_dev], np.arange(n_devices + 1))
    new = tuple.__new__              # Action(s, kind, m) without the NamedTuple constructor's call
    rows = []
    for d in range(n_devices):
        idx = by_dev[cuts[d]:cuts[d + 1]]
        rows.append(tuple(new(Action, (s, kinds[k], m)) for s, k, m in
                          zip(stage[idx].tolist(), kind[idx].tolist(), mb[idx].tolist())))
    return ScheduleTable(tuple(rows), cand.placement, M, name)


def to_plan(problem: Problem, cand: Candidate, result: ListResult | None = None,
            model: str = "", meta: dict | None = None, pieces: Mapping[int, int] | None = None) -> Plan:
    """The candidate's frozen table as a plan; `pieces`: the layers the problem's model split."""
    result = result if result is not None else problem.estimate(cand)
    table = to_table(cand, result, problem.n_devices, problem.n_microbatches)
    return Plan(cand.partition, table, model=model, cluster=problem.cluster.name, meta=dict(meta or {}),
                pieces=pieces or {}, policy=policy_of(cand))


def policy_of(cand: Candidate) -> SchedulePolicy:
    """The candidate's scheduling policy as the plan keeps it."""
    return SchedulePolicy(cand.split_backward, float(cand.inflight), tuple(cand.kind_rank),
                          cand.f_tiebreak, cand.b_tiebreak, cand.w_pressure, tuple(cand.warmup))


def candidate_of(plan: Plan, policy: SchedulePolicy) -> Candidate:
    """The candidate that list-schedules `plan`'s partition and placement under `policy`."""
    return Candidate(plan.partition, tuple(plan.placement), policy.split_backward, policy.inflight,
                     tuple(policy.kind_rank), policy.f_tiebreak, policy.b_tiebreak,
                     policy.w_pressure, policy.warmup)
