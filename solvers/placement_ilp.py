"""Joint partition + placement ILP: which layers form each stage AND which device holds it.

Variables (S stages, L layers, D devices, K device kinds):

- staircase z (solvers.staircase): (S-1)(L-S+1) binaries for the contiguous partition;
- a[s, d] binary: stage s on device d; every device holds exactly `S / D` stages (the chunks),
  so stages may sit on a device non-adjacently (interleaved, V-shaped or any map);
- w[s, d] >= work of stage s on d's kind - M (1 - a[s, d]): the stage's time where it lands;
- m[s, d] >= static + act_mult[d] * activation bytes of stage s - M (1 - a[s, d]);
- x[s] >= a[s, d] - a[s+1, d] (boundary s crosses devices), y[s] likewise per node (crosses
  nodes); comm[s] >= intra transfer(bytes_s) - M (1 - x[s]), >= inter transfer - M (1 - y[s]);
- e[s, d] >= comm[s] - M (1 - a[s, d]) and >= comm[s] - M (1 - a[s+1, d]): the transfer is
  charged to both devices of a crossing boundary (as in `solvers.instance`);
- minimize T with  sum_s w[s, d] + e[s, d] <= T  and  sum_s m[s, d] <= capacity_d.

Size: (S-1)(L-S+1) + S·D binaries, about 4·S·D + 3·S continuous variables and
2(S-1)L + 6·S·D + S·(nodes) constraints. The big-M links make the LP relaxation weak (a
fractional a[s, d] spreads a stage over devices), so proofs of optimality rely on branching over
a; `python -m solvers.bench` measures where that stops being practical.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np
import pulp

from octopipe.cluster import Cluster
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError, InfeasibleError
from solvers.backend import SolverConfig, run_model
from solvers.instance import Partition, PartitionInstance, partition_from_bounds
from solvers.partition_ilp import GIB, explain_shortfall, solve_instance, time_unit
from solvers.result import PartitionResult, make_result
from solvers.staircase import Staircase, reach_windows


@dataclass
class PlacementModel:
    load_expr: list            # per device: load expression (time units)
    mem_expr: list             # per device: memory expression (GiB)
    solution: Callable[[], tuple[Partition, tuple[int, ...]]]


def stages_per_device(inst: PartitionInstance) -> int:
    S, D = inst.n_stages, inst.n_devices
    if S % D:
        raise ConfigError(f"joint placement needs n_stages ({S}) to be a multiple of the devices "
                          f"({D}): each device holds n_stages/pp stages (chunks)")
    return S // D


def incumbent(inst: PartitionInstance, cfg: SolverConfig) -> PartitionResult | None:
    """The best fixed-placement optimum over the loop and V placements (each device holding
    n_stages / devices stages): a feasible joint plan that bounds the joint optimum."""
    from octopipe.schedule.table import loop_placement, v_placement
    k = stages_per_device(inst)
    best = None
    for pl in {loop_placement(inst.n_devices, k), v_placement(inst.n_devices, k)}:
        try:
            r = solve_instance(inst.with_placement(pl), cfg, explain=False)
        except InfeasibleError:
            continue
        if r.fits_memory and (best is None or r.objective < best.objective):
            best = r
    return best


def build_placement_model(prob: pulp.LpProblem, inst: PartitionInstance,
                          objective: pulp.LpVariable | None,
                          upper_bound: float | None = None) -> PlacementModel:
    """Add the joint model's variables and constraints to `prob` (see the module docstring).

    With `upper_bound` (a known plan's objective) the stage ends are windowed as in the
    partition ILP, with each stage's work taken on the fastest kind (valid wherever it lands),
    and `T <= upper_bound`.
    """
    S, L, D = inst.n_stages, inst.n_layers, inst.n_devices
    k = stages_per_device(inst)
    tu = time_unit(inst)
    costs, cl = inst.costs, inst.cluster
    used = sorted(set(inst.col))
    fastest = np.min(inst.work_ps[:, used], axis=1)
    windows = None
    if upper_bound is not None:
        windows = reach_windows(lambda s, lo, hi: float(fastest[hi] - fastest[lo]), L, S, upper_bound)
    stair = Staircase(prob, L, S, windows=windows)
    if upper_bound is not None and objective is not None:
        prob += objective <= upper_bound / tu * (1 + 1e-9), "incumbent"
    a = {(s, d): pulp.LpVariable(f"a_{s}_{d}", cat=pulp.LpBinary) for s in range(S) for d in range(D)}
    for s in range(S):
        prob += pulp.lpSum(a[s, d] for d in range(D)) == 1, f"one_device_{s}"
    for d in range(D):
        prob += pulp.lpSum(a[s, d] for s in range(S)) == k, f"chunks_{d}"
    work = costs.f + costs.i + costs.w
    cols = sorted(set(inst.col))
    stage_work = {(s, c): stair.expr(stair.stage_terms(s, work[:, c], 1.0 / tu))
                  for s in range(S) for c in cols}
    big_w = {c: float(work[:, c].sum()) / tu for c in cols}
    load_terms: list[list] = [[] for _ in range(D)]
    mem_terms: list[list] = [[] for _ in range(D)]
    for s in range(S):
        for d in range(D):
            c = inst.col[d]
            w = pulp.LpVariable(f"w_{s}_{d}", lowBound=0)
            prob += w >= stage_work[s, c] - big_w[c] * (1 - a[s, d]), f"work_{s}_{d}"
            load_terms[d].append(w)
            mult = inst.inflight[d] / k
            per_layer = costs.static_bytes + mult * costs.act_bytes
            big_m = float(per_layer.sum()) / GIB
            if big_m > 0:
                m = pulp.LpVariable(f"m_{s}_{d}", lowBound=0)
                prob += m >= stair.expr(stair.stage_terms(s, per_layer, 1.0 / GIB)) - big_m * (1 - a[s, d]), \
                    f"memory_{s}_{d}"
                mem_terms[d].append(m)
    nodes = sorted(set(cl.node))
    inter = len(nodes) > 1
    max_out = float(costs.out_bytes.max()) if costs.n_layers else 0.0
    slow = max(cl.intra_link.transfer_time(max_out), cl.inter_link.transfer_time(max_out)) / tu
    for s in range(S - 1):
        x = pulp.LpVariable(f"x_{s}", lowBound=0, upBound=1)
        for d in range(D):
            prob += x >= a[s, d] - a[s + 1, d], f"cross_{s}_{d}"
        comm = pulp.LpVariable(f"comm_{s}", lowBound=0)
        for link, flag in ((cl.intra_link, x), (cl.inter_link, None)):
            if flag is None:
                if not inter:
                    continue
                flag = pulp.LpVariable(f"y_{s}", lowBound=0, upBound=1)
                for n in nodes:
                    on_n = [d for d in range(D) if cl.node[d] == n]
                    prob += flag >= pulp.lpSum(a[s, d] for d in on_n) - pulp.lpSum(
                        a[s + 1, d] for d in on_n), f"cross_node_{s}_{n}"
            t = stair.expr(stair.boundary_terms(s, costs.out_bytes, 1.0 / (link.bandwidth * tu)),
                           link.latency / tu)
            prob += comm >= t - slow * (1 - flag), f"comm_{link.name}_{s}"
        for d in range(D):
            for side, s2 in (("src", s), ("dst", s + 1)):
                e = pulp.LpVariable(f"e_{side}_{s}_{d}", lowBound=0)
                prob += e >= comm - slow * (1 - a[s2, d]), f"charge_{side}_{s}_{d}"
                load_terms[d].append(e)
    load_expr = [pulp.lpSum(t) for t in load_terms]
    mem_expr = [pulp.lpSum(t) for t in mem_terms]
    if objective is not None:
        for d in range(D):
            prob += load_expr[d] <= objective, f"load_{d}"
            if mem_terms[d]:
                prob += mem_expr[d] <= inst.cap[d] / GIB, f"mem_{d}"

    def solution() -> tuple[Partition, tuple[int, ...]]:
        part = partition_from_bounds(stair.bounds(), L)
        pl = tuple(int(np.argmax([a[s, d].value() or 0.0 for d in range(D)])) for s in range(S))
        return part, pl

    return PlacementModel(load_expr, mem_expr, solution)


def solve_placement_instance(inst: PartitionInstance, cfg: SolverConfig | None = None,
                             explain: bool = True, presolve: bool = True) -> PartitionResult:
    """Solve the joint ILP; `presolve` first solves the loop and V placements with the partition
    ILP and uses the better plan to window the stage ends and bound T (same optimum)."""
    cfg = cfg or SolverConfig()
    t0 = time.perf_counter()
    inc = incumbent(inst, cfg) if presolve else None
    prob = pulp.LpProblem("partition_placement", pulp.LpMinimize)
    T = pulp.LpVariable("T", lowBound=0)
    prob += T
    model = build_placement_model(prob, inst, T, inc.objective if inc is not None else None)
    out = run_model(prob, cfg)
    out = replace(out, solve_time_s=time.perf_counter() - t0)
    name = f"joint_ilp_{cfg.name}" if presolve else f"joint_ilp_plain_{cfg.name}"
    size = dict(n_variables=len(prob.variables()), n_constraints=len(prob.constraints))
    if not out.has_solution:
        if out.status == "Infeasible" and explain:
            raise InfeasibleError(explain_shortfall(inst, cfg, placement=()))
        if inc is not None:
            return _from_incumbent(inc, inst, name, out.solve_time_s, size)
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
                              schedule_name: str = "1f1b", n_microbatches: int = 8,
                              chunks: int | None = None, solver_cfg: SolverConfig | None = None,
                              inflight: Sequence[float] | None = None) -> PartitionResult:
    """Jointly optimal partition and placement (each device holds n_stages / devices stages).

    Same objective and memory model as `solve_partition`; boundaries that cross devices pay the
    intra-node link, those that cross nodes the inter-node link. Raises InfeasibleError when no
    plan fits memory.
    """
    inst = PartitionInstance.build(costs, cluster, n_stages, None, schedule_name, n_microbatches,
                                   chunks, inflight)
    return solve_placement_instance(inst, solver_cfg)
