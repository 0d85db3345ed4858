"""The ILPs' partitions and placements (`solvers`) as the search's starting candidates."""
from __future__ import annotations

import math
import time

from octopipe.config.solver import SolverConfig
from octopipe.errors import OctoPipeError
from octopipe.plan import Partition
from octopipe.schedule.table import v_placement
from octopipe.tune.candidate import Candidate, Problem
from solvers.instance import Inflight
from solvers.partition_ilp import solve_partition
from solvers.placement_ilp import solve_partition_placement

# the joint partition + placement ILP only where it solves quickly: on larger instances
# (54 layers x 8 devices) even its first 50 nodes took 18 s, and on 25 layers x 4 devices its
# 100 nodes took 3.1 s where the loop placement's partition ILP took 0.1 s (the authors' 32
# cases keep their plans without it); those fix the loop placement
JOINT_ILP_MAX_CELLS = 64


# the partition ILPs up to this many layer-stage cells: 100 nodes of the V partition ILP on 216
# layer pieces x 64 stages took minutes, most of a large instance's tuning
PARTITION_ILP_MAX_CELLS = 4096

# the V partition ILP (two stages per device) up to this many cells: CBC's root alone (before
# any node) took 3.1 s on 42 layers x 16 stages, and its 100 nodes 1.9 s on 54 x 8, 4.4 s on
# 42 x 16 and 7.2 s on 58 x 16, never proven optimal; on the authors' 32 cases (all above this)
# the plans are the same without it. The loop ILP solves those sizes to optimality in < 0.1 s
V_ILP_MAX_CELLS = 256


def partition_starts(problem: Problem, scfg: SolverConfig) -> tuple[list[Candidate], dict]:
    """ILP partitions (solvers, with `scfg`'s node limit and time cap) as starting candidates:
    the joint partition + placement ILP with one stage per device (the partition ILP on the loop
    placement beyond JOINT_ILP_MAX_CELLS layer-device pairs), and the partition ILP on the V
    placement with two stages per device."""
    D, L, M = problem.n_devices, problem.n_layers, problem.n_microbatches
    # the joint ILP with several stages per device takes tens of seconds on this class of
    # machine, more than the whole tuning budget, so it runs with one stage per device only
    runs = [("loop", 1, "zbh1", None if L * D <= JOINT_ILP_MAX_CELLS else tuple(range(D))),
            ("V", 2, "zbv", v_placement(D, 2))]
    cands: list[Candidate] = []
    info: dict = {}
    for label, chunks, sched, placement in runs:
        if D * chunks > L:
            continue
        most = PARTITION_ILP_MAX_CELLS if label == "loop" else V_ILP_MAX_CELLS
        if L * D * chunks > most:
            run = {"status": "skipped", "schedule": sched,
                   "reason": f"{L} layers x {D * chunks} stages > {most} cells"}
            if label == "loop":
                info = run
            else:
                info["v"] = run
            continue
        t0 = time.perf_counter()
        try:
            if placement is None:
                res = solve_partition_placement(problem.costs, problem.cluster, D * chunks,
                                                Inflight(sched, M, chunks), scfg)
            else:
                res = solve_partition(problem.costs, problem.cluster, D * chunks, placement,
                                      Inflight(sched, M, chunks), scfg)
        except OctoPipeError as e:
            run = {"status": "infeasible", "reason": str(e).splitlines()[0], "schedule": sched}
        else:
            run = {"method": res.method, "status": res.status, "objective_s": res.objective,
                   "proven_optimal": res.proven_optimal, "fits_memory": res.fits_memory,
                   "solve_time_s": time.perf_counter() - t0, "stages": len(res.partition),
                   "schedule": sched, "time_capped": res.time_capped, "max_nodes": scfg.max_nodes}
            if res.partition:
                part = Partition.of(res.partition)
                cands += [Candidate(part, tuple(res.placement), split_backward, infl, origin=f"ILP {label}")
                          for split_backward in (True, False) for infl in (1.0, 2.0, math.inf)]
        if label == "loop":
            info = run
        else:
            info["v"] = run
    return cands, info
