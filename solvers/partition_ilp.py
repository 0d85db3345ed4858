"""Partition ILP: consecutive stages for a fixed placement, minimizing the bottleneck device.

    minimize T
    s.t.  load_d(z) <= T                          for every device d
          static_d(z) + act_d(z) <= capacity_d    for every device d
          z a staircase (solvers.staircase)

`load_d` sums F+I+W of the device's stages on its own kind plus one transfer per crossing
boundary it touches (latency + boundary bytes / link bandwidth; the bytes depend on where the
boundary falls, linearly in z). Times are scaled to units of the mean stage's work and bytes to
GiB so that the solver's tolerances are meaningful. Any placement works, including several
non-adjacent stages per device.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np
import pulp

from octopipe.cluster import Cluster
from octopipe.cost.table import CostTable
from octopipe.errors import InfeasibleError, OctoPipeError
from solvers.backend import SolverConfig, run_model
from solvers.instance import PartitionInstance, partition_from_bounds
from solvers.result import PartitionResult, make_result
from solvers.staircase import Staircase, reach_windows

GIB = float(2 ** 30)


def time_unit(inst: PartitionInstance) -> float:
    return max(float(inst.work_ps[-1].min()) / inst.n_stages, 1e-12)


def add_device_terms(inst: PartitionInstance, stair: Staircase, placement: Sequence[int],
                     tu: float) -> tuple[list, list]:
    """Per device: (load terms, load constant) and (memory terms) for a fixed placement."""
    D = inst.n_devices
    work = inst.costs.f + inst.costs.i + inst.costs.w
    mult = inst.act_mult(placement)
    load = [([], 0.0) for _ in range(D)]
    mem = [[] for _ in range(D)]
    for s, d in enumerate(placement):
        load[d][0].extend(stair.stage_terms(s, work[:, inst.col[d]], 1.0 / tu))
        mem_layer = inst.costs.static_bytes + mult[s] * inst.costs.act_bytes
        mem[d].extend(stair.stage_terms(s, mem_layer, 1.0 / GIB))
    load = [list(x) for x in load]
    for s in range(inst.n_stages - 1):
        a, b = placement[s], placement[s + 1]
        link = inst.cluster.link(a, b)
        if link is None:
            continue
        terms = stair.boundary_terms(s, inst.costs.out_bytes, 1.0 / (link.bandwidth * tu))
        for d in (a, b):
            load[d][0].extend(terms)
            load[d][1] += link.latency / tu
    return load, mem


def incumbent_windows(inst: PartitionInstance, placement: Sequence[int]
                      ) -> tuple[list[tuple[int, int]] | None, float | None]:
    """Windows on every stage end implied by a local-search plan's objective (when it fits memory).

    Any plan at least as good as the greedy one has every stage's work below that objective, so
    stage ends outside the reachable windows can be fixed before the solver starts.
    """
    from solvers.greedy import greedy_partition, improve_by_shifts
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
    T = pulp.LpVariable("T", lowBound=0)
    prob += T
    windows, ub = incumbent_windows(inst, placement) if presolve else (None, None)
    stair = Staircase(prob, inst.n_layers, inst.n_stages, windows=windows)
    if ub is not None:
        prob += T <= ub / tu * (1 + 1e-9), "incumbent"
    load, mem = add_device_terms(inst, stair, placement, tu)
    for d in range(inst.n_devices):
        terms, const = load[d]
        if terms or const:
            prob += stair.expr(terms, const) <= T, f"load_{d}"
        if mem[d]:
            prob += stair.expr(mem[d]) <= inst.cap[d] / GIB, f"mem_{d}"
    out = run_model(prob, cfg)
    name = f"ilp_{cfg.name}" if presolve else f"ilp_plain_{cfg.name}"
    size = dict(n_variables=len(prob.variables()), n_constraints=len(prob.constraints))
    if not out.has_solution:
        if out.status == "Infeasible" and explain:
            raise InfeasibleError(explain_shortfall(inst, cfg))
        return PartitionResult((), placement, float("inf"), (), (), False, False, out.solve_time_s,
                               name, status=out.status.lower(), **size)
    part = partition_from_bounds(stair.bounds(), inst.n_layers)
    bound = out.bound * tu if out.bound is not None else None
    return make_result(inst, part, placement, name, out.solve_time_s, out.proven_optimal,
                       status="optimal" if out.proven_optimal else "feasible", bound=bound, **size)


def solve_partition(costs: CostTable, cluster: Cluster, n_stages: int,
                    placement: Sequence[int], schedule_name: str = "1f1b",
                    n_microbatches: int = 8, chunks: int | None = None,
                    solver_cfg: SolverConfig | None = None,
                    inflight: Sequence[float] | None = None) -> PartitionResult:
    """Optimal consecutive partition of `costs`' layers into `n_stages` for a fixed placement.

    Activations in flight per device come from the schedule library's formulas for
    `schedule_name` (override with `inflight`, one count per device). Raises InfeasibleError
    naming the device and bytes short when no partition fits memory.
    """
    inst = PartitionInstance.build(costs, cluster, n_stages, placement, schedule_name,
                                   n_microbatches, chunks, inflight)
    return solve_instance(inst, solver_cfg)


def explain_shortfall(inst: PartitionInstance, cfg: SolverConfig,
                      placement: Sequence[int] | None = None) -> str:
    """Why nothing fits: the smallest possible worst overflow, on which device, and what helps.

    Solves `min E s.t. memory_d - capacity_d <= E` over the same partitions (and placements
    when the placement is free): E is then the fewest bytes the tightest device is short in
    every plan.
    """
    from solvers.placement_ilp import build_placement_model
    placement = tuple(placement if placement is not None else inst.placement)
    prob = pulp.LpProblem("shortfall", pulp.LpMinimize)
    E = pulp.LpVariable("E")
    prob += E
    if placement:
        stair = Staircase(prob, inst.n_layers, inst.n_stages)
        _, mem = add_device_terms(inst, stair, placement, time_unit(inst))
        for d in range(inst.n_devices):
            if mem[d]:
                prob += stair.expr(mem[d]) - inst.cap[d] / GIB <= E, f"short_{d}"
        get = lambda: (partition_from_bounds(stair.bounds(), inst.n_layers), placement)  # noqa: E731
    else:
        model = build_placement_model(prob, inst, objective=None)
        for d in range(inst.n_devices):
            prob += model.mem_expr[d] - inst.cap[d] / GIB <= E, f"short_{d}"
        get = model.solution
    out = run_model(prob, cfg)
    if not out.has_solution:
        return (f"no plan fits the devices' memory and the shortfall model did not solve "
                f"({out.status}); add devices or reduce activation memory")
    part, pl = get()
    _, memory = inst.evaluate(part, pl)
    short = memory - inst.cap
    d = int(np.argmax(short))
    static = sum(inst.static_ps[hi] - inst.static_ps[lo] for (lo, hi), x in zip(part, pl) if x == d)
    acts = memory[d] - static
    kind = inst.cluster.kind_of(d).name
    return (f"the model does not fit: even in the best plan device {d} ({kind}, "
            f"{inst.cap[d] / GIB:.1f} GiB) is {short[d] / GIB:.2f} GiB ({short[d]:.3e} bytes) short "
            f"(static {static / GIB:.2f} GiB + activations {acts / GIB:.2f} GiB for "
            f"{inst.inflight[d]:g} micro-batches in flight); use more devices (pp), activation "
            f"recomputation, or a schedule with fewer micro-batches in flight")
