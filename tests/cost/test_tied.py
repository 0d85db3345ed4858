"""A shared parameter's gradient all-reduce is charged to its first holder's weight-gradient work."""
from __future__ import annotations

import numpy as np
import pytest

from octopipe.cluster_presets import cluster_from_config
from octopipe.config.presets import preset
from octopipe.cost.table import CostTable
from octopipe.cost.tied import allreduce_s, charge_ties


def _costs(n: int) -> CostTable:
    ones = np.ones(n)
    return CostTable(tuple(f"l{j}" for j in range(n)), ("gpu",), ones, ones, ones, ones, ones, ones, ones)


def test_the_all_reduce_lands_on_the_first_holders_w_spread_over_micro_batches():
    cluster = cluster_from_config(preset("cluster", "h100_1x8"), pp=4)
    nbytes = 4.0 * 50_000_000
    charged = charge_ties(_costs(4), [(0, nbytes, 2)], cluster, 8)
    link = cluster.link(0, 1)
    want = 2 * (link.latency + nbytes / 2 / link.bandwidth)      # a ring of 2: the half each way, twice
    assert charged.w[0, 0] == pytest.approx(1.0 + want / 8)
    assert np.array_equal(charged.w[1:], np.ones((3, 1))) and np.array_equal(charged.f, _costs(4).f)
    assert charged.b[0, 0] == pytest.approx(2.0 + want / 8)
    assert allreduce_s(nbytes, 1, cluster) == 0.0
    plain = _costs(4)
    assert charge_ties(plain, [], cluster, 8) is plain
