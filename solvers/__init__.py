"""OctoPipe's exact methods: ILP partitioning and placement (PuLP: CBC, HiGHS), DP/greedy/brute
baselines, and SMT (z3) checks of deadlock-freedom and memory feasibility of lowered tables.

Public API (stable, used by the tuner):

- `PartitionInstance.build(costs, cluster, n_stages, placement, schedule_name, n_microbatches,
  chunks)` and `PartitionResult`
- `solve_partition(...)`, `solve_partition_placement(...)`: ILPs
- `dp_partition(inst)`, `greedy_partition(inst)`, `brute_force_partition(inst)`: baselines
- `check_deadlock_free(table, semantics)`, `check_memory_feasible(table, ...)`: SMT verdicts
- `SolverConfig` (octopipe.config.solver): backend, time limit, gap, threads
"""
from __future__ import annotations

import warnings

# PuLP 3.x announces its 4.0 API on every variable; the old API is the one pulp>=2.7 shares.
warnings.filterwarnings("ignore", message=r".*PuLP 4\.0.*", category=DeprecationWarning)
warnings.filterwarnings("ignore", message=r".*PULP_CBC_CMD is deprecated.*", category=DeprecationWarning)
warnings.filterwarnings("ignore", message=r".*LpProblem\.constraints as a dict.*", category=DeprecationWarning)

from solvers.backend import SolverConfig  # noqa: E402
from solvers.brute import brute_force_partition, brute_force_placement  # noqa: E402
from solvers.dp import dp_partition  # noqa: E402
from solvers.greedy import greedy_partition, improve_by_shifts  # noqa: E402
from solvers.instance import PartitionInstance  # noqa: E402
from solvers.partition_ilp import solve_instance, solve_partition  # noqa: E402
from solvers.placement_ilp import solve_partition_placement, solve_placement_instance  # noqa: E402
from solvers.result import PartitionResult  # noqa: E402
from solvers.smt import SmtVerdict, check_deadlock_free, check_memory_feasible  # noqa: E402

__all__ = ["SolverConfig", "PartitionInstance", "PartitionResult", "solve_partition",
           "solve_instance", "solve_partition_placement", "solve_placement_instance",
           "dp_partition", "greedy_partition", "improve_by_shifts", "brute_force_partition",
           "brute_force_placement", "SmtVerdict", "check_deadlock_free", "check_memory_feasible"]
