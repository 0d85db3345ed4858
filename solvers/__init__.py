"""OctoPipe's exact methods: ILP partitioning and placement (PuLP: CBC, HiGHS), DP/greedy/brute
baselines, and SMT (z3) checks of deadlock-freedom and memory feasibility of lowered tables.

Public API (stable, used by the tuner):

- `PartitionInstance.build(costs, cluster, n_stages, placement, inflight)` and `PartitionResult`;
  `Inflight(schedule, n_microbatches, chunks)`: the schedule whose formula gives each device's
  activation copies in flight (or pass the counts themselves)
- `solve_partition(costs, cluster, n_stages, placement, inflight, solver_cfg)`,
  `solve_partition_placement(costs, cluster, n_stages, inflight, solver_cfg)`: ILPs
- `dp_partition(inst)`, `greedy_partition(inst)`, `brute_force_partition(inst)`: baselines
- `check_deadlock_free(table, semantics)`, `check_memory_feasible(table, ...)`: SMT verdicts
- `SolverConfig` (octopipe.config.solver): backend, time limit, gap, threads
"""
from __future__ import annotations

from solvers.backend import SolverConfig
from solvers.brute import brute_force_partition, brute_force_placement
from solvers.dp import dp_partition
from solvers.greedy import greedy_partition, improve_by_shifts
from solvers.instance import Inflight, PartitionInstance
from solvers.partition_ilp import solve_instance, solve_partition
from solvers.partition_result import PartitionResult
from solvers.placement_ilp import solve_partition_placement, solve_placement_instance
from solvers.smt import SmtVerdict, check_deadlock_free, check_memory_feasible

__all__ = [
           "Inflight",
           "PartitionInstance",
           "PartitionResult",
           "SmtVerdict",
           "SolverConfig",
           "brute_force_partition",
           "brute_force_placement",
           "check_deadlock_free",
           "check_memory_feasible",
           "dp_partition",
           "greedy_partition",
           "improve_by_shifts",
           "solve_instance",
           "solve_partition",
           "solve_partition_placement",
           "solve_placement_instance",
]
