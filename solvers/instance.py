"""The partitioning problem every solver shares, and its one evaluator.

A `PartitionInstance` fixes the numbers an ILP, the DP, the greedy balancer and brute force all
read: per device, the CostTable column of its kind, its memory capacity and how many
micro-batches of activations the schedule keeps in flight on it; per boundary between stage s
and s+1, what a transfer costs. `evaluate` is the single definition of the objective:

- a device's load (seconds per micro-batch) = sum over its stages of F + I + W on the device's
  kind, plus, for each stage boundary it touches that crosses devices, one transfer of the
  boundary layer's output (it sends the activation or the gradient, `latency + bytes/bandwidth`
  on the link between the two devices);
- the objective is the largest load (the pipeline's bottleneck);
- a device's memory = static bytes (parameters, gradients, optimizer state) of its stages +
  `act_mult[s] * act_bytes(stage s)` for each of its stages, where `act_mult[s]` is the
  schedule's in-flight count on the device split evenly over the stages it holds.

Per-stage numbers come from `octopipe.cost.stage_costs.StageCosts` and the prefix sums the
formulations index from the CostTable's own (`CostTable.prefix`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from octopipe.cluster import Cluster
from octopipe.cost.stage_costs import StageCosts
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.plan import Partition
from octopipe.schedule import library as formulas


def inflight_counts(schedule_name: str, n_devices: int, n_microbatches: int,
                    chunks: int | None = None) -> tuple[float, ...]:
    """Activation copies the named schedule keeps alive at its peak, per device (schedule library)."""
    return tuple(float(formulas.inflight_microbatches(schedule_name, n_devices, d, n_microbatches,
                                                      chunks))
                 for d in range(n_devices))


@dataclass(frozen=True)
class Inflight:
    """Where each device's activation copies at the peak come from: the schedule library's
    formula for `schedule` at `n_microbatches` (and `chunks` stages per device)."""

    schedule: str = "1f1b"
    n_microbatches: int = 8
    chunks: int | None = None

    def counts(self, n_devices: int) -> tuple[float, ...]:
        return inflight_counts(self.schedule, n_devices, self.n_microbatches, self.chunks)


@dataclass(frozen=True, eq=False)
class PartitionInstance:
    """All the numbers of one partitioning problem (see the module docstring for the model)."""

    costs: CostTable
    cluster: Cluster
    n_stages: int
    placement: tuple[int, ...]          # stage -> device; () when placement is a decision
    inflight: tuple[float, ...]         # per device: activation copies at the peak
    col: tuple[int, ...]                # per device: CostTable column
    cap: np.ndarray                     # per device: memory bytes

    @classmethod
    def build(cls, costs: CostTable, cluster: Cluster, n_stages: int,
              placement: Sequence[int] | None = None, inflight: Inflight | Sequence[float] = Inflight(),
              memory_bytes: Sequence[float] | None = None) -> PartitionInstance:
        """Check the inputs and precompute. `inflight`: the schedule whose formula gives each
        device's in-flight count, or the counts themselves (one per device); `memory_bytes`
        overrides the devices' capacities."""
        n_dev = cluster.n_devices
        if n_stages < 1:
            raise ConfigError(f"n_stages={n_stages} must be at least 1")
        if n_stages > costs.n_layers:
            raise ConfigError(f"n_stages={n_stages} exceeds the model's {costs.n_layers} layers; "
                              "use fewer stages (pp × chunks) or a deeper model")
        if placement is not None:
            placement = tuple(int(d) for d in placement)
            if len(placement) != n_stages:
                raise ConfigError(f"placement has {len(placement)} entries for {n_stages} stages")
            if any(not 0 <= d < n_dev for d in placement):
                raise ConfigError(f"placement {placement} names a device outside 0..{n_dev - 1}")
        if isinstance(inflight, Inflight):
            inflight = inflight.counts(n_dev)
        inflight = tuple(float(x) for x in inflight)
        if len(inflight) != n_dev:
            raise ConfigError(f"inflight has {len(inflight)} entries for {n_dev} devices")
        cap = np.array(memory_bytes if memory_bytes is not None
                       else [cluster.kind_of(d).memory_bytes for d in range(n_dev)], dtype=float)
        return cls(costs, cluster, n_stages, placement or (), inflight, costs.columns_for(cluster), cap)

    @property
    def n_layers(self) -> int:
        return self.costs.n_layers

    @property
    def n_devices(self) -> int:
        return self.cluster.n_devices

    @property
    def work_ps(self) -> np.ndarray:
        """[layer + 1, column] prefix sums of f + i + w."""
        return self.costs.prefix("work")

    @property
    def act_ps(self) -> np.ndarray:
        return self.costs.prefix("act_bytes")

    @property
    def static_ps(self) -> np.ndarray:
        return self.costs.prefix("static_bytes")

    def with_placement(self, placement: Sequence[int]) -> PartitionInstance:
        return replace(self, placement=tuple(placement))

    def stages(self, partition: Partition | Sequence[tuple[int, int]],
               placement: Sequence[int]) -> StageCosts:
        return StageCosts.bind(self.costs, partition, placement, self.col)

    def act_mult(self, placement: Sequence[int]) -> np.ndarray:
        """Per stage: activation copies alive at the peak (device's count over its stage count)."""
        counts = np.bincount(np.asarray(placement), minlength=self.n_devices)
        return np.array([self.inflight[d] / counts[d] for d in placement])

    def stage_work(self, lo: int, hi: int, device: int) -> float:
        c = self.col[device]
        return float(self.work_ps[hi, c] - self.work_ps[lo, c])

    def transfer(self, layer: int, a: int, b: int) -> float:
        """Seconds to send layer `layer`'s output from device a to b (0 on the same device)."""
        return self.cluster.transfer_time(a, b, float(self.costs.out_bytes[layer]))

    def stage_memory(self, lo: int, hi: int, mult: float) -> float:
        return float(self.static_ps[hi] - self.static_ps[lo] + mult * (self.act_ps[hi] - self.act_ps[lo]))

    def evaluate(self, partition: Partition, placement: Sequence[int] | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
        """(load seconds per device, memory bytes per device) of a partition under a placement."""
        placement = tuple(placement if placement is not None else self.placement)
        check_partition(partition, self.n_layers, self.n_stages)
        st = self.stages(partition, placement)
        load = np.zeros(self.n_devices)
        mem = np.zeros(self.n_devices)
        mem_s = st.static_bytes + self.act_mult(placement) * st.act_bytes
        cross = st.boundary_transfers(self.cluster)
        for s, d in enumerate(placement):
            load[d] += st.work[s]
            mem[d] += mem_s[s]
            if s + 1 < len(placement) and placement[s + 1] != d:
                load[d] += cross[s]
                load[placement[s + 1]] += cross[s]
        return load, mem

    def fits(self, mem: np.ndarray, rtol: float = 1e-9) -> bool:
        return bool(np.all(mem <= self.cap * (1 + rtol)))


def check_partition(partition: Partition, n_layers: int, n_stages: int) -> None:
    if len(partition) != n_stages:
        raise ConfigError(f"partition has {len(partition)} stages, expected {n_stages}")
    prev = 0
    for s, (lo, hi) in enumerate(partition):
        if lo != prev or hi <= lo:
            raise ConfigError(f"partition stage {s} = [{lo}, {hi}) is empty or not contiguous")
        prev = hi
    if prev != n_layers:
        raise ConfigError(f"partition covers {prev} layers, the model has {n_layers}")


def partition_from_bounds(bounds: Sequence[int], n_layers: int) -> Partition:
    """Stage ends (exclusive) of all but the last stage (`Partition.from_cuts`)."""
    return Partition.from_cuts(bounds, n_layers)
