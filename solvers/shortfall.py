"""Why no plan fits memory: the smallest worst overflow over every plan, named and explained."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pulp

from solvers.backend import SolverConfig, run_model
from solvers.instance import PartitionInstance, partition_from_bounds
from solvers.partition_model import add_device_terms
from solvers.placement_model import build_placement_model
from solvers.staircase import Staircase
from solvers.units import GIB, time_unit


def explain_shortfall(inst: PartitionInstance, cfg: SolverConfig,
                      placement: Sequence[int] | None = None) -> str:
    """Why nothing fits: the smallest possible worst overflow, on which device, and what helps.

    Solves `min E s.t. memory_d - capacity_d <= E` over the same partitions (and placements
    when the placement is free): E is then the fewest bytes the tightest device is short in
    every plan.
    """
    placement = tuple(placement if placement is not None else inst.placement)
    prob = pulp.LpProblem("shortfall", pulp.LpMinimize)
    E = prob.add_variable("E")
    prob += E
    if placement:
        stair = Staircase(prob, inst.n_layers, inst.n_stages)
        _, mem = add_device_terms(inst, stair, placement, time_unit(inst))
        for d in range(inst.n_devices):
            if mem[d]:
                prob += stair.expr(mem[d]) - inst.cap[d] / GIB <= E, f"short_{d}"
        get = lambda: (partition_from_bounds(stair.bounds(), inst.n_layers), placement)
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
