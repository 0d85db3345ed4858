"""The runtime's host seconds per action (`runtime.host_time`): an action's time beyond its
blocks' profiled time, through the runtime's own compute path."""
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from octopipe.cluster import Link
from octopipe.config.cost import ProfiledCost
from octopipe.cost.profiled import profile_blocks, token_batch
from octopipe.cost.table import CostTable
from octopipe.model.user_module import UserBlocks, check_blocks
from octopipe.runtime import host_time
from octopipe.runtime.compute import RealCompute
from octopipe.runtime.host_time import FixedBatches, action_host_seconds, with_host_time
from octopipe.runtime.machine import local_cluster
from octopipe.runtime.stage import SpecBlocks
from octopipe.train.setup import EXAMPLE_FACTORY
from tests.runtime import tiny

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def case():
    blocks = check_blocks(UserBlocks(EXAMPLE_FACTORY, 32, 2, 128))
    cost = ProfiledCost(device="cpu", cache_dir="", repeats=2, warmup=1)
    costs = profile_blocks(blocks, cost, local_cluster(2, Link("loop", 1e9, 1e-5)))
    return blocks, cost, costs


def _scaled(costs, k: float):
    return replace(costs, f=costs.f * k, i=costs.i * k, w=costs.w * k, full_b=costs.b * k, _prefix={})


def test_against_zero_profiled_seconds_it_is_an_actions_whole_time(case):
    blocks, _, costs = case
    batches = FixedBatches(token_batch(blocks, CPU))
    h = action_host_seconds(blocks, _scaled(costs, 0.0), CPU, batches, rounds=2)
    assert h > 0.0
    assert action_host_seconds(blocks, _scaled(costs, 1e6), CPU, batches, rounds=2) == 0.0   # never negative


def test_work_added_to_every_action_is_counted(case, monkeypatch):
    """Each action made to sleep 5 ms more: against zero profiled seconds the figure is at least
    that (a sleep never ends early)."""
    blocks, _, costs = case
    for name in ("forward", "backward", "backward_input", "backward_weight"):
        inner = getattr(RealCompute, name)

        def slow(self, *args, _inner=inner):
            time.sleep(0.005)
            return _inner(self, *args)
        monkeypatch.setattr(RealCompute, name, slow)
    h = action_host_seconds(blocks, _scaled(costs, 0.0), CPU, FixedBatches(token_batch(blocks, CPU)), rounds=1)
    assert h >= 0.005


def test_with_host_time_sets_only_the_host_time(case, monkeypatch):
    blocks, cost, costs = case
    monkeypatch.setattr(host_time, "action_host_seconds", lambda *a, **k: 1.5e-4)
    got = with_host_time(costs, blocks, cost)
    assert got.action_s == 1.5e-4
    for name in ("f", "i", "w", "b", "act_bytes", "static_bytes", "out_bytes"):
        assert np.array_equal(getattr(got, name), getattr(costs, name))
    assert costs.action_s == 0.0


def test_the_profile_times_a_full_backward_per_block(case):
    _, _, costs = case
    assert costs.full_b is not None and (costs.b > 0).all()
    assert not np.array_equal(costs.b, costs.i + costs.w)     # measured, not I + W


def test_a_presets_host_time_is_cached_beside_its_profile(tmp_path, monkeypatch):
    """Cached costs plan as the last run did: the second call reads the figure the first wrote;
    a user's blocks (profiled afresh every run) are measured afresh too."""
    calls = []
    monkeypatch.setattr(host_time, "action_host_seconds", lambda *a, **k: calls.append(1) or 2e-4 * len(calls))
    cost = ProfiledCost(device="cpu", cache_dir=str(tmp_path))
    spec = SpecBlocks(tiny.dense())
    costs = CostTable.uniform(spec.model.n_layers)
    assert with_host_time(costs, spec, cost).action_s == 2e-4
    assert with_host_time(costs, spec, cost).action_s == 2e-4 and len(calls) == 1
    assert host_time.cache_path(spec, replace(cost, threads=2)) != host_time.cache_path(spec, cost)
    blocks = check_blocks(UserBlocks(EXAMPLE_FACTORY, 32, 2, 128))
    assert host_time.cache_path(blocks, cost) is None
