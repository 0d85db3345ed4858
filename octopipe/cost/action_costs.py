"""Seconds per compute action of a plan, from a CostTable (for ``plan.meta["action_costs"]``)."""
from __future__ import annotations

from collections.abc import Sequence

from octopipe.cost.table import CostTable
from octopipe.errors import ScheduleError
from octopipe.plan import Plan


def action_costs(plan: Plan, costs: CostTable, kind_of_device: Sequence[int]) -> dict[str, float]:
    """Seconds per compute action of `plan`, keyed by the action's string form.

    `kind_of_device[d]` is the CostTable kind index of device d; a stage is costed on the device
    that runs it for that micro-batch; a full backward costs the table's B (I + W unless
    measured), and every action the table's host seconds per action once (`StageCosts.bind`).
    """
    if len(kind_of_device) < plan.table.n_devices:
        raise ScheduleError(f"kind_of_device lists {len(kind_of_device)} devices; the table uses "
                            f"{plan.table.n_devices}")
    out: dict[str, float] = {}
    for d, a in plan.table:
        if a.kind.is_comm:
            continue
        lo, hi = plan.partition[a.stage]
        k = int(kind_of_device[d])
        names = ("i", "w") if a.kind.value == "B" and costs.full_b is None else (a.kind.value.lower(),)
        out[str(a)] = float(sum(costs.range_sum(n, lo, hi, k) for n in names)) + costs.action_s
    return out
