"""Joint partition + placement ILP against brute force, and the pieces its speed relies on
(symmetry breaking between interchangeable devices and nodes, run splitting)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from octopipe.cluster import Link
from octopipe.errors import ConfigError, InfeasibleError
from solvers import placement_ilp
from solvers.backend import SolverConfig
from solvers.brute import brute_force_placement
from solvers.instance import PartitionInstance
from solvers.placement_ilp import solve_placement_instance
from solvers.placement_model import cut_runs, device_keys, interchangeable, memory_cannot_bind
from tests.solvers.instances import GB, make_cluster, random_costs

SHAPES = [(2, 1), (2, 2), (2, 3), (3, 1), (3, 2), (4, 1)]     # (devices, stages per device)


def _random_joint(seed: int) -> PartitionInstance:
    """Small joint instances of every shape: one or two nodes, homogeneous or mixed kinds,
    equal or rank-dependent activations in flight, loose or binding memory."""
    rng = np.random.default_rng(seed)
    D, k = SHAPES[seed % len(SHAPES)]
    S = D * k
    L = int(rng.integers(S, S + (3 if S < 6 else 2)))
    costs = random_costs(rng, L)
    nodes = int(rng.integers(1, min(D, 2) + 1))
    cl = make_cluster(D, hetero=bool(rng.integers(0, 2)), nodes=nodes)
    inflight = [float(D - d) for d in range(D)] if rng.integers(0, 2) else [2.0] * D
    memory = None
    if rng.random() < 0.5:      # about the mean share of the model: binds, sometimes infeasible
        share = (costs.static_bytes.sum() + np.mean(inflight) / k * costs.act_bytes.sum()) / D
        memory = [share * float(rng.uniform(0.95, 1.3))] * D
    return PartitionInstance.build(costs, cl, S, None, inflight=inflight, memory_bytes=memory)


@pytest.mark.parametrize("seed", range(48))
def test_joint_ilp_equals_brute_force_on_random_instances(seed):
    inst = _random_joint(seed)
    k = inst.n_stages // inst.n_devices
    brute = brute_force_placement(inst, stages_per_device=k)
    if brute.status == "infeasible":
        with pytest.raises(InfeasibleError, match="short"):
            solve_placement_instance(inst)
        return
    for presolve in (True, False):
        res = solve_placement_instance(inst, presolve=presolve)
        assert res.proven_optimal
        assert res.objective == pytest.approx(brute.objective, rel=1e-7)
        assert res.fits_memory
        assert np.bincount(res.placement, minlength=inst.n_devices).tolist() == [k] * inst.n_devices
        load, _ = inst.evaluate(res.partition, res.placement)
        assert float(load.max()) == pytest.approx(res.objective, rel=1e-12)


def test_faster_inter_node_link_is_charged_exactly():
    # an inter-node link faster than the intra-node one: the surcharge is negative, so the
    # node-crossing flags must be exact rather than lower bounds
    rng = np.random.default_rng(5)
    costs = random_costs(rng, 7)
    cl = make_cluster(4, hetero=True, nodes=2)
    cl = replace(cl, intra_link=Link("slow", 2e9, 2e-4), inter_link=Link("fast", 4e11, 1e-6))
    inst = PartitionInstance.build(costs, cl, 4, None, inflight=[1.0] * 4)
    res = solve_placement_instance(inst, presolve=False)
    assert res.objective == pytest.approx(brute_force_placement(inst, stages_per_device=1).objective,
                                          rel=1e-7)


def test_interchangeable_devices_and_nodes():
    costs = random_costs(np.random.default_rng(0), 40)
    homo = make_cluster(8, hetero=False, nodes=2)
    inst = PartitionInstance.build(costs, homo, 16, None, inflight=[float(8 - d) for d in range(8)])
    free = [memory_cannot_bind(inst, d, 2) for d in range(8)]
    assert all(free)                            # 80 GB hold the whole model on any device
    devs, nodes = interchangeable(inst, device_keys(inst, 2, free))
    assert devs == [[0, 1, 2, 3], [4, 5, 6, 7]] and nodes == [[0, 1]]
    # memory that may bind: devices with different activation shares are no longer alike
    tight = PartitionInstance.build(costs, homo, 16, None, inflight=inst.inflight,
                                    memory_bytes=[6 * GB] * 8)
    free = [memory_cannot_bind(tight, d, 2) for d in range(8)]
    assert not any(free)
    assert interchangeable(tight, device_keys(tight, 2, free)) == ([], [])
    # ... unless an upper bound on T limits how much any device can hold
    ub = 2 * float(np.diff(tight.work_ps[:, 1]).min())     # two layers' worth of work at most
    assert all(memory_cannot_bind(tight, d, 2, ub) for d in range(8))
    mixed = make_cluster(8, hetero=True, nodes=2)
    inst = PartitionInstance.build(costs, mixed, 8, None, inflight=[1.0] * 8)
    devs, nodes = interchangeable(inst, device_keys(inst, 1, [True] * 8))
    assert devs == [[0, 2], [1, 3], [4, 6], [5, 7]] and nodes == [[0, 1]]


def test_split_runs_gives_every_device_its_stages():
    # device 0 holds one run of 4 layers but must hold 2 stages; device 1 has its 2 runs
    part, pl = cut_runs([1, 0, 0, 0, 0, 1, 1], 2, 2)
    assert pl.count(0) == 2 and pl.count(1) == 2
    assert part[0] == (0, 1) and part[-1] == (5, 7)
    assert [d for s, (lo, hi) in enumerate(part) for d in [pl[s]] * (hi - lo)] == [1, 0, 0, 0, 0, 1, 1]
    with pytest.raises(Exception, match="runs"):
        cut_runs([0, 1, 0, 1, 0], 2, 2)       # device 0 has 3 runs, more than its 2 stages


def test_joint_needs_a_multiple_of_the_devices():
    costs = random_costs(np.random.default_rng(1), 8)
    inst = PartitionInstance.build(costs, make_cluster(3), 4, None, inflight=[1.0] * 3)
    with pytest.raises(ConfigError, match="multiple"):
        solve_placement_instance(inst)


def test_time_limit_bounds_the_whole_solve(monkeypatch):
    """The incumbent and the joint ILP share `time_limit_s`: the joint ILP is given what the
    incumbent left (at least the 1 s floor), never the whole limit again. Read from the limits
    each solve is given, so the test holds at any load."""
    costs = random_costs(np.random.default_rng(2), 48)
    inst = PartitionInstance.build(costs, make_cluster(8, hetero=True), 16, None,
                                   inflight=[float(8 - d) for d in range(8)])
    given = []
    real = placement_ilp.run_model

    def run_model(prob, cfg):
        given.append(cfg.time_limit_s)
        return real(prob, cfg)
    monkeypatch.setattr(placement_ilp, "run_model", run_model)
    res = solve_placement_instance(inst, SolverConfig(time_limit_s=3.0))
    joint = given[-1]
    assert 1.0 <= joint < 3.0
    assert res.fits_memory and np.isfinite(res.objective)
