"""PartitionResult: what every partitioning method returns, so they compare side by side."""
from __future__ import annotations

from dataclasses import dataclass, field

from solvers.instance import Partition, PartitionInstance


@dataclass(frozen=True)
class PartitionResult:
    """A partition (stage -> layer range) and placement (stage -> device) with its figures.

    `objective` is the bottleneck device load in seconds per micro-batch (see
    `solvers.instance`); `bound` is a proven lower bound when the method has one (equal to the
    objective when `proven_optimal`); `fits_memory` says whether every device is within capacity.
    """

    partition: Partition | tuple[()]     # () when no partition was found
    placement: tuple[int, ...]
    objective: float
    device_load_s: tuple[float, ...]
    device_memory_bytes: tuple[float, ...]
    fits_memory: bool
    proven_optimal: bool
    solve_time_s: float
    method: str
    status: str = "ok"
    bound: float | None = None
    n_variables: int = 0
    n_constraints: int = 0
    time_capped: bool = False            # a solve stopped by its time limit (machine-dependent)
    meta: dict = field(default_factory=dict, compare=False)

    @property
    def stage_sizes(self) -> tuple[int, ...]:
        return tuple(hi - lo for lo, hi in self.partition)

    def as_dict(self) -> dict:
        return {"method": self.method, "status": self.status,
                "partition": [list(p) for p in self.partition], "placement": list(self.placement),
                "objective_s": self.objective, "bound_s": self.bound,
                "proven_optimal": self.proven_optimal, "solve_time_s": self.solve_time_s,
                "fits_memory": self.fits_memory, "device_load_s": list(self.device_load_s),
                "device_memory_bytes": list(self.device_memory_bytes),
                "n_variables": self.n_variables, "n_constraints": self.n_constraints,
                "time_capped": self.time_capped}


def make_result(inst: PartitionInstance, partition: Partition, placement: tuple[int, ...],
                method: str, solve_time_s: float, proven_optimal: bool, **kw) -> PartitionResult:
    """Evaluate `partition` with the shared evaluator and wrap it."""
    load, mem = inst.evaluate(partition, placement)
    return PartitionResult(Partition.of(partition), tuple(placement), float(load.max()),
                           tuple(float(x) for x in load), tuple(float(x) for x in mem),
                           inst.fits(mem), proven_optimal, solve_time_s, method, **kw)
