"""Partition ILP: consecutive stages for a fixed placement, minimizing the bottleneck device.

    minimize T
    s.t.  load_d(z) <= T                          for every device d
          static_d(z) + act_d(z) <= capacity_d    for every device d
          z a staircase (solvers.staircase)

`load_d` and `memory_d` are `solvers.partition_model`'s terms, in `solvers.units`' scales. Any
placement works, including several non-adjacent stages per device.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pulp

from octopipe.cluster import Cluster
from octopipe.cost.table import CostTable
from octopipe.errors import InfeasibleError, OctoPipeError
from solvers.backend import SolverConfig, run_model
from solvers.greedy import greedy_partition, improve_by_shifts
from solvers.instance import Inflight, PartitionInstance, partition_from_bounds
from solvers.partition_model import add_device_terms
from solvers.partition_result import PartitionResult, make_result
from solvers.shortfall import explain_shortfall
from solvers.staircase import Staircase, reach_windows
from solvers.units import GIB, time_unit


def incumbent_windows(inst: PartitionInstance, placement: Sequence[int]
                      ) -> tuple[list[tuple[int, int]] | None, float | None]:
    """Windows on every stage end implied by a local-search plan's objective (when it fits memory).

    Any plan at least as good as the greedy one has every stage's work below that objective, so
    stage ends outside the reachable windows can be fixed before the solver starts.
    """
    fixed = inst.with_placement(placement)
    g = improve_by_shifts(fixed, greedy_partition(fixed))
    if not g.fits_memory:
        return None, None
    win = reach_windows(lambda s, lo, hi: inst.stage_work(lo, hi, placement[s]),
                        inst.n_layers, inst.n_stages, g.objective)
    return win, g.objective


def solve_instance(inst: PartitionInstance, cfg: SolverConfig | None = None,
                   explain: bool = True, presolve: bool = True) -> PartitionResult:
    """Solve the partition ILP of `inst` (placement fixed); see `solve_partition`.

    `presolve` fixes the stage ends a greedy incumbent rules out (`incumbent_windows`); the
    optimum is the same, found much faster.
    """
    cfg = cfg or SolverConfig()
    if cfg.name == "cbc" and not cfg.cbc_options:
        # CBC's preprocessing spends seconds strengthening rows of this small model before a
        # root solve that needs no branching (measured: 5.4 s -> 2.6 s on llama3_8b, 16 stages)
        cfg = replace(cfg, cbc_options=("preprocess off",))
    placement = inst.placement
    if not placement:
        raise OctoPipeError("solve_instance needs a placement; use solve_partition_placement")
    tu = time_unit(inst)
    prob = pulp.LpProblem("partition", pulp.LpMinimize)
    T = prob.add_variable("T", lowBound=0)
    prob += T
    windows, ub = incumbent_windows(inst, placement) if presolve else (None, None)
    stair = Staircase(prob, inst.n_layers, inst.n_stages, windows=windows)
    if ub is not None:
        prob += ub / tu * (1 + 1e-9) >= T, "incumbent"
    load, mem = add_device_terms(inst, stair, placement, tu)
    for d in range(inst.n_devices):
        terms, const = load[d]
        if terms or const:
            prob += stair.expr(terms, const) <= T, f"load_{d}"
        if mem[d]:
            prob += stair.expr(mem[d]) <= inst.cap[d] / GIB, f"mem_{d}"
    out = run_model(prob, cfg)
    name = f"ilp_{cfg.name}" if presolve else f"ilp_plain_{cfg.name}"
    size = dict(n_variables=len(prob.variables()), n_constraints=len(prob.constraints()))
    if not out.has_solution:
        if out.status == "Infeasible" and explain:
            raise InfeasibleError(explain_shortfall(inst, cfg))
        return PartitionResult((), placement, float("inf"), (), (), False, False, out.solve_time_s,
                               name, status=out.status.lower(), time_capped=out.time_capped, **size)
    part = partition_from_bounds(stair.bounds(), inst.n_layers)
    bound = out.bound * tu if out.bound is not None else None
    return make_result(inst, part, placement, name, out.solve_time_s, out.proven_optimal,
                       status="optimal" if out.proven_optimal else "feasible", bound=bound,
                       time_capped=out.time_capped, **size)


def solve_partition(costs: CostTable, cluster: Cluster, n_stages: int, placement: Sequence[int],
                    inflight: Inflight | Sequence[float] = Inflight(),
                    solver_cfg: SolverConfig | None = None) -> PartitionResult:
    """Optimal consecutive partition of `costs`' layers into `n_stages` for a fixed placement.

    Activations in flight per device come from the schedule library's formulas for the schedule
    `inflight` names (or are `inflight`, one count per device). Raises InfeasibleError naming
    the device and bytes short when no partition fits memory.
    """
    inst = PartitionInstance.build(costs, cluster, n_stages, placement, inflight)
    return solve_instance(inst, solver_cfg)
