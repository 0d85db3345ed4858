"""Joint partition + placement ILP: solve the model of `solvers.placement_model` from an incumbent.

The loop and V placements, solved by the partition ILP, give an incumbent that bounds T and
lets devices whose memory cannot bind below it be interchanged.

Size: L·D binaries, 2(L-1)·D continuous (4(L-1)·D with several nodes) and about
2(L-1)·D (4(L-1)·D) + 2L + 4D constraints plus L per interchangeable pair; e.g. L=64, D=8:
512 binaries, 1521 variables, ~1600 constraints. The LP bound is the fractional kind assignment
(T >= total work / speed-weighted devices) with almost no transfer cost, so a proof must branch
until the layers' granularity and the transfers show; `python -m solvers.bench` measures where
this stops (CBC, this machine: proven up to L=16 with 2 stages per device on 4 devices in a few
seconds; L=32 with 4-8 devices and everything larger ends at the time limit with a feasible plan,
typically within 1 % of the bound).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import pulp

from octopipe.cluster import Cluster
from octopipe.cost.table import CostTable
from octopipe.errors import InfeasibleError
from octopipe.schedule.table import loop_placement, v_placement
from solvers.backend import SolverConfig, run_model
from solvers.instance import Inflight, PartitionInstance
from solvers.partition_ilp import solve_instance
from solvers.partition_result import PartitionResult, make_result
from solvers.placement_model import build_placement_model, stages_per_device
from solvers.shortfall import explain_shortfall
from solvers.units import time_unit

INCUMBENT_SHARE = 0.1     # of the time limit, for each of the two fixed-placement solves


def incumbent(inst: PartitionInstance, cfg: SolverConfig) -> PartitionResult | None:
    """The best fixed-placement optimum over the loop and V placements (each device holding
    n_stages / devices stages): a feasible joint plan that bounds the joint optimum."""
    k = stages_per_device(inst)
    best, capped = None, False
    for pl in sorted({loop_placement(inst.n_devices, k), v_placement(inst.n_devices, k)}):
        try:
            r = solve_instance(inst.with_placement(pl), cfg, explain=False)
        except InfeasibleError:
            continue
        capped = capped or r.time_capped
        if r.fits_memory and (best is None or r.objective < best.objective):
            best = r
    return replace(best, time_capped=capped) if best is not None else None


def solve_placement_instance(inst: PartitionInstance, cfg: SolverConfig | None = None,
                             explain: bool = True, presolve: bool = True) -> PartitionResult:
    """Solve the joint ILP within `cfg.time_limit_s` in all.

    `presolve` first solves the loop and V placements with the partition ILP (a tenth of the
    time limit each) and hands the better plan to the joint ILP as its start and bound on T,
    which also lets it interchange devices whose memory cannot bind below that bound (same
    optimum).
    """
    cfg = cfg or SolverConfig()
    t0 = time.perf_counter()
    inc = None
    if presolve:
        inc = incumbent(inst, replace(cfg, time_limit_s=max(1.0, INCUMBENT_SHARE * cfg.time_limit_s)))
    prob = pulp.LpProblem("partition_placement", pulp.LpMinimize)
    T = prob.add_variable("T", lowBound=0)
    prob += T
    model = build_placement_model(prob, inst, T, inc.objective if inc is not None else None)
    left = cfg.time_limit_s - (time.perf_counter() - t0)
    out = run_model(prob, replace(cfg, time_limit_s=max(1.0, left)))
    out = replace(out, solve_time_s=time.perf_counter() - t0)
    name = f"joint_ilp_{cfg.name}" if presolve else f"joint_ilp_plain_{cfg.name}"
    size = dict(n_variables=len(prob.variables()), n_constraints=len(prob.constraints()),
                time_capped=out.time_capped or bool(inc is not None and inc.time_capped))
    if not out.has_solution:
        if inc is not None:
            return _from_incumbent(inc, inst, name, out.solve_time_s, size)
        if out.status == "Infeasible" and explain:
            raise InfeasibleError(explain_shortfall(inst, cfg, placement=()))
        return PartitionResult((), (), float("inf"), (), (), False, False, out.solve_time_s, name,
                               status=out.status.lower(), **size)
    part, pl = model.solution()
    tu = time_unit(inst)
    bound = out.bound * tu if out.bound is not None else None
    res = make_result(inst, part, pl, name, out.solve_time_s, out.proven_optimal,
                      status="optimal" if out.proven_optimal else "feasible", bound=bound, **size)
    if inc is not None and inc.objective < res.objective - 1e-12:
        return _from_incumbent(inc, inst, name, out.solve_time_s, size)
    return res


def _from_incumbent(inc: PartitionResult, inst: PartitionInstance, name: str, dt: float,
                    size: dict) -> PartitionResult:
    """The time limit struck before the joint ILP beat its incumbent: return the incumbent."""
    return make_result(inst, inc.partition, inc.placement, name, dt, False, status="feasible",
                       meta={"source": "incumbent"}, **size)


def solve_partition_placement(costs: CostTable, cluster: Cluster, n_stages: int,
                              inflight: Inflight | Sequence[float] = Inflight(),
                              solver_cfg: SolverConfig | None = None) -> PartitionResult:
    """Jointly optimal partition and placement (each device holds n_stages / devices stages).

    Same objective and memory model as `solve_partition`; boundaries that cross devices pay the
    intra-node link, those that cross nodes the inter-node link. Raises InfeasibleError when no
    plan fits memory.
    """
    inst = PartitionInstance.build(costs, cluster, n_stages, None, inflight)
    return solve_placement_instance(inst, solver_cfg)
