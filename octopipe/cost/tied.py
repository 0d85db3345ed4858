"""What a parameter several blocks share costs a pipeline: each stage holding it keeps a copy
(its block's parameter, gradient and optimizer bytes, which the profiler already counts per
block), and after every iteration the copies' gradients are summed by an all-reduce over the
ranks holding them. That all-reduce is charged to the first holder's weight-gradient work (the
first stage finishes an iteration last, so it lands on the critical path), spread over the
iteration's micro-batches, whatever the placement: the planner sees it without knowing where
the holders will sit."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from octopipe.cluster import Cluster
from octopipe.cost.table import CostTable


def allreduce_s(nbytes: float, ranks: int, cluster: Cluster) -> float:
    """A ring all-reduce of `nbytes` over `ranks` ranks on the cluster's link between ranks 0 and 1:
    2 (k - 1) / k of the bytes each way."""
    if ranks < 2 or cluster.n_devices < 2:
        return 0.0
    return 2 * (ranks - 1) * cluster.transfer_time(0, 1, nbytes / ranks)


def charge_ties(costs: CostTable, ties: Sequence[tuple[int, float, int]], cluster: Cluster,
                n_microbatches: int) -> CostTable:
    """`costs` with each shared parameter's gradient all-reduce added to its first holder's
    weight-gradient time (and full backward); `ties` = (first holder layer, bytes of its gradient, holders)."""
    if not ties:
        return costs
    w = np.array(costs.w, dtype=np.float64)
    b = None if costs.full_b is None else np.array(costs.full_b, dtype=np.float64)
    for layer, nbytes, holders in ties:
        extra = allreduce_s(nbytes, min(holders, cluster.n_devices), cluster) / max(1, n_microbatches)
        w[layer, :] += extra
        if b is not None:
            b[layer, :] += extra
    return replace(costs, w=w, full_b=b, _prefix={})
