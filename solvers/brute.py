"""Brute force over every contiguous partition (and, optionally, every placement): the oracle.

Only for tiny instances: C(L-1, S-1) partitions times D^S placements.
"""
from __future__ import annotations

import itertools
import time
from math import comb

from octopipe.errors import ConfigError
from solvers.instance import PartitionInstance, partition_from_bounds
from solvers.partition_result import PartitionResult, make_result

MAX_CANDIDATES = 2_000_000


def _best(inst: PartitionInstance, placements, method: str) -> PartitionResult:
    t0 = time.perf_counter()
    L, S = inst.n_layers, inst.n_stages
    best = None
    best_key = None
    for placement in placements:
        for bounds in itertools.combinations(range(1, L), S - 1):
            part = partition_from_bounds(bounds, L)
            load, mem = inst.evaluate(part, placement)
            if not inst.fits(mem):
                continue
            key = float(load.max())
            if best_key is None or key < best_key - 1e-12:
                best_key, best = key, (part, tuple(placement))
    dt = time.perf_counter() - t0
    if best is None:
        return PartitionResult((), inst.placement, float("inf"), (), (), False, True, dt, method,
                               status="infeasible")
    res = make_result(inst, best[0], best[1], method, dt, True)
    return res


def brute_force_partition(inst: PartitionInstance) -> PartitionResult:
    """The optimum for `inst.placement` by enumerating every partition (any placement shape)."""
    if not inst.placement:
        raise ConfigError("brute_force_partition needs a fixed placement")
    n = comb(inst.n_layers - 1, inst.n_stages - 1)
    if n > MAX_CANDIDATES:
        raise ConfigError(f"brute force would enumerate {n} partitions; it is meant for tiny "
                          f"instances (at most {MAX_CANDIDATES})")
    return _best(inst, [inst.placement], "brute")


def brute_force_placement(inst: PartitionInstance, require_all_devices: bool = True,
                          stages_per_device: int | None = None) -> PartitionResult:
    """The joint optimum over partitions and placements (every device used when asked; with
    `stages_per_device`, only placements where every device holds exactly that many stages,
    the joint ILP's feasible set)."""
    D, S = inst.n_devices, inst.n_stages
    n = comb(inst.n_layers - 1, S - 1) * D ** S
    if n > MAX_CANDIDATES:
        raise ConfigError(f"brute force would enumerate {n} (partition, placement) pairs; it is "
                          f"meant for tiny instances (at most {MAX_CANDIDATES})")
    placements = (p for p in itertools.product(range(D), repeat=S)
                  if (not require_all_devices or len(set(p)) == min(D, S))
                  and (stages_per_device is None
                       or all(p.count(d) == stages_per_device for d in range(D))))
    return _best(inst, placements, "brute_placement")
