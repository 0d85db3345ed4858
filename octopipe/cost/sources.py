"""The CostTable the `cost` section names: analytic (roofline), file (a profile) or profiled
(measured here)."""
from __future__ import annotations

from octopipe.cluster import Cluster
from octopipe.config.cost import CostConfig, FileCost, ProfiledCost
from octopipe.cost.analytic import analytic_costs
from octopipe.cost.from_file import load_cost_file
from octopipe.cost.table import CostTable
from octopipe.model.spec import ModelSpec


def cost_table(cost: CostConfig, model: ModelSpec, cluster: Cluster) -> CostTable:
    """The CostTable of `model` on `cluster`'s device kinds from the source `cost` describes."""
    if isinstance(cost, FileCost):
        return load_cost_file(cost, model, cluster)
    if isinstance(cost, ProfiledCost):
        from octopipe.cost.profiled import profiled_costs  # imports torch: only cost=profiled
        return profiled_costs(cost, model, cluster)
    return analytic_costs(cost, model, cluster)
