"""Plans under a memory budget (`tuner.memory_budget`): the activation budget in bytes per device,
and the zero-bubble schedules, hand-made and automatic, that rank with the finalists under it."""
from __future__ import annotations

import numpy as np

from octopipe.cost.stage_costs import StageCosts
from octopipe.errors import InfeasibleError
from octopipe.plan import Partition, Plan
from octopipe.schedule.action import Action, F, I, W
from octopipe.schedule.library import build_schedule
from octopipe.schedule.table import ScheduleTable
from octopipe.tune.candidate import Candidate, Problem
from octopipe.tune.search import (
    fmt_bytes,
)
from solvers.zb_auto import ZbInstance, zb_auto_schedule

BUDGET_SCHEDULES = (("zbh1", 1), ("zbh2", 1), ("zbv", 2))


def budget_plans(problem: Problem, model: str) -> list[Plan]:
    """Under a memory budget, the zero-bubble hand-made schedules (ZB-H1 at 1F1B's memory, ZB-H2
    at about twice it, ZB-V) on uniform and balanced stages rank with the finalists; those over
    the budget drop out there."""
    D, M, L = problem.n_devices, problem.n_microbatches, problem.n_layers
    work = problem.layer_work().mean(axis=1)
    out = []
    for name, v in BUDGET_SCHEDULES:
        if D * v > L:
            continue
        table = build_schedule(name, D, M, chunks=v)
        for part in dict.fromkeys((Partition.uniform(L, D * v), Partition.balanced(work, D * v))):
            out.append(Plan(part, table, model=model, cluster=problem.cluster.name,
                            meta={"origin": f"{name} under the memory budget"}))
    if D <= L:
        for part in dict.fromkeys((Partition.uniform(L, D), Partition.balanced(work, D))):
            table = _zb_auto_table(problem, part)
            if table is not None:
                out.append(Plan(part, table, model=model, cluster=problem.cluster.name,
                                meta={"origin": "zero-bubble's automatic scheduler under the "
                                                "memory budget"}))
    return out


def _zb_auto_table(problem: Problem, part: Partition) -> ScheduleTable | None:
    """zero-bubble's automatic scheduler (`solvers.zb_auto`) on one stage per device, with the
    stages' own times, bytes and budget; None when its greedy cannot fit the budget."""
    D, M = problem.n_devices, problem.n_microbatches
    arr = problem.arrays(Candidate(part, tuple(range(D))))
    dur = np.asarray(arr.dur)
    tup = lambda x: tuple(float(v) for v in x)
    inst = ZbInstance(tup(dur[:, 0]), tup(dur[:, 1]), tup(dur[:, 2]), tup(arr.act),
                      tup(np.asarray(arr.act) - np.asarray(arr.free_i)),
                      tup(np.where(np.asarray(arr.cap) < 0, np.inf, arr.cap)),
                      float(np.max(arr.comm_f, initial=0.0)), M)
    try:
        z = zb_auto_schedule(inst)
    except InfeasibleError:
        return None
    rows = [[Action(s, (F, I, W)[k], mb) for k, mb in z.rows[s]] for s in range(D)]
    return ScheduleTable.from_rows(rows, tuple(range(D)), M, "zb_auto")


def s1f1b_activation(problem: Problem) -> float:
    """The most activation bytes any device holds under S-1F1B (uniform stages, one per device):
    stage s keeps min(D - s, M) micro-batches of its activations."""
    D, M = problem.n_devices, problem.n_microbatches
    st = StageCosts.bind(problem.costs, Partition.uniform(problem.n_layers, D), tuple(range(D)),
                         problem.kind_col)
    return float(max(min(D - s, M) * st.act_bytes[s] for s in range(D)))


def activation_budget(problem: Problem, multiple: float) -> np.ndarray:
    """tuner.memory_budget in bytes per device; InfeasibleError when even the heaviest layer's
    activations for one micro-batch exceed it (no partition or schedule can then fit)."""
    ref = s1f1b_activation(problem)
    budget = multiple * ref
    act = problem.costs.act_bytes
    j = int(np.argmax(act))
    if act[j] > budget * (1 + 1e-9):
        raise InfeasibleError(
            f"tuner.memory_budget={multiple:g}: {fmt_bytes(budget)} of activations per device "
            f"({multiple:g} x S-1F1B's {fmt_bytes(ref)}), but layer {j} "
            f"({problem.costs.layer_names[j]}) alone holds {fmt_bytes(act[j])} for one "
            f"micro-batch: short by {fmt_bytes(act[j] - budget)}; raise the budget")
    return np.full(problem.n_devices, budget)
