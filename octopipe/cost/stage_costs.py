"""StageCosts: a CostTable bound to a partition and a placement, the one place that does so.

Each stage is costed on the CostTable column of the device that holds it; every figure is a
difference of the table's prefix sums (`CostTable.prefix`). The tuner's problem
(`octopipe.tune.candidate.Problem`), the solvers' instance (`solvers.instance`) and the
simulator's durations (`octopipe.sim.durations`) all read their per-stage numbers from here.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from octopipe.cluster import Cluster
from octopipe.cost.table import CostTable
from octopipe.plan import Partition


@dataclass(frozen=True, eq=False)
class StageCosts:
    """[S] arrays of one partition and placement: seconds per micro-batch on each stage's
    device kind, bytes per stage, and the bytes each stage's last layer sends onwards. Each of
    F, I, W and a full backward B includes the table's host time per action once."""

    partition: Partition
    placement: np.ndarray          # [S] device of each stage
    column: np.ndarray             # [S] CostTable column the stage is costed on
    f: np.ndarray
    i: np.ndarray
    w: np.ndarray
    work: np.ndarray               # F + I + W, from the prefix sums of the summed times
    full_b: np.ndarray             # a full backward: I + W, or the measured one plus one action's host time
    act_bytes: np.ndarray
    w_act_bytes: np.ndarray
    static_bytes: np.ndarray
    out_bytes: np.ndarray          # [S] bytes stage s sends to stage s + 1 (its last layer's output)

    @classmethod
    def bind(cls, costs: CostTable, partition: Partition | Sequence[tuple[int, int]],
             placement: Sequence[int], device_columns: Sequence[int]) -> StageCosts:
        """`device_columns[d]`: the CostTable column of device d (`CostTable.columns_for`)."""
        part = Partition.of(partition)
        dev = np.asarray(placement, dtype=np.int64)
        col = np.asarray(device_columns, dtype=np.int64)[dev]
        lo, hi = part.bounds[:-1], part.bounds[1:]
        h = costs.action_s
        f, i, w = (costs.range_sums(n, lo, hi, col) + h for n in "fiw")
        b = costs.range_sums("b", lo, hi, col) + h if costs.own_b else i + w
        return cls(part, dev, col, f, i, w, costs.range_sums("work", lo, hi, col) + 3.0 * h, b,
                   costs.range_sums("act_bytes", lo, hi), costs.range_sums("w_act_bytes", lo, hi),
                   costs.range_sums("static_bytes", lo, hi), costs.out_bytes[hi - 1])

    @property
    def n_stages(self) -> int:
        return len(self.placement)

    @property
    def b(self) -> np.ndarray:
        """Full backward seconds (I + W where the table has no measured full backward)."""
        return self.full_b

    def per_device(self, values: np.ndarray, n_devices: int) -> np.ndarray:
        """[D] sums of a per-stage array over the stages each device holds (in stage order)."""
        return np.bincount(self.placement, weights=values, minlength=n_devices)

    def boundary_transfers(self, cluster: Cluster) -> np.ndarray:
        """[S - 1] seconds to send across each stage boundary (0 where both stages share a device)."""
        dev = self.placement
        out = np.zeros(max(0, len(dev) - 1))
        for s in np.flatnonzero(dev[:-1] != dev[1:]):
            out[s] = cluster.transfer_time(int(dev[s]), int(dev[s + 1]), float(self.out_bytes[s]))
        return out
