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
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from octopipe.cluster import Cluster
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError

Partition = tuple[tuple[int, int], ...]


def inflight_counts(schedule_name: str, n_devices: int, n_microbatches: int,
                    chunks: int | None = None) -> tuple[float, ...]:
    """Activation copies the named schedule keeps alive at its peak, per device (schedule library)."""
    from octopipe.schedule import library as formulas
    return tuple(float(formulas.inflight_microbatches(schedule_name, n_devices, d, n_microbatches,
                                                      chunks))
                 for d in range(n_devices))


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
    work_ps: np.ndarray                 # [layer+1, column] prefix sums of f + i + w
    act_ps: np.ndarray                  # [layer+1] prefix sums of act_bytes
    static_ps: np.ndarray               # [layer+1] prefix sums of static_bytes

    @classmethod
    def build(cls, costs: CostTable, cluster: Cluster, n_stages: int,
              placement: Sequence[int] | None = None, schedule_name: str = "1f1b",
              n_microbatches: int = 8, chunks: int | None = None,
              inflight: Sequence[float] | None = None,
              memory_bytes: Sequence[float] | None = None) -> "PartitionInstance":
        """Check the inputs and precompute; `inflight`/`memory_bytes` override the defaults."""
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
        if inflight is None:
            inflight = inflight_counts(schedule_name, n_dev, n_microbatches, chunks)
        inflight = tuple(float(x) for x in inflight)
        if len(inflight) != n_dev:
            raise ConfigError(f"inflight has {len(inflight)} entries for {n_dev} devices")
        cap = np.array(memory_bytes if memory_bytes is not None
                       else [cluster.kind_of(d).memory_bytes for d in range(n_dev)], dtype=float)
        work = costs.f + costs.i + costs.w
        work_ps = np.vstack([np.zeros((1, work.shape[1])), np.cumsum(work, axis=0)])
        act_ps = np.concatenate([[0.0], np.cumsum(costs.act_bytes)])
        static_ps = np.concatenate([[0.0], np.cumsum(costs.static_bytes)])
        return cls(costs, cluster, n_stages, placement or (), inflight, costs.columns_for(cluster),
                   cap, work_ps, act_ps, static_ps)

    @property
    def n_layers(self) -> int:
        return self.costs.n_layers

    @property
    def n_devices(self) -> int:
        return self.cluster.n_devices

    def with_placement(self, placement: Sequence[int]) -> "PartitionInstance":
        return PartitionInstance(self.costs, self.cluster, self.n_stages, tuple(placement),
                                 self.inflight, self.col, self.cap, self.work_ps, self.act_ps,
                                 self.static_ps)

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
        load = np.zeros(self.n_devices)
        mem = np.zeros(self.n_devices)
        mult = self.act_mult(placement)
        for s, (lo, hi) in enumerate(partition):
            d = placement[s]
            load[d] += self.stage_work(lo, hi, d)
            mem[d] += self.stage_memory(lo, hi, mult[s])
            if s + 1 < len(partition) and placement[s + 1] != d:
                t = self.transfer(hi - 1, d, placement[s + 1])
                load[d] += t
                load[placement[s + 1]] += t
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
    """Stage ends (exclusive) of all but the last stage -> ((lo, hi), ...)."""
    edges = [0, *[int(b) for b in bounds], n_layers]
    return tuple(zip(edges[:-1], edges[1:]))
