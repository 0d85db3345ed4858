"""Partition ILP against its oracles: the linear-partition DP and brute force."""
from __future__ import annotations

import numpy as np
import pytest

from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError, InfeasibleError, SolverUnavailableError
from octopipe.schedule.table import loop_placement, v_placement
from solvers import backend
from solvers.backend import SolverConfig
from solvers.brute import brute_force_partition, brute_force_placement
from solvers.dp import dp_partition
from solvers.greedy import greedy_partition, improve_by_shifts
from solvers.instance import Inflight, PartitionInstance
from solvers.partition_ilp import solve_instance, solve_partition
from solvers.placement_ilp import solve_placement_instance
from tests.solvers.instances import GB, make_cluster, random_costs


def _instance(seed: int, n_layers: int, n_dev: int, placement=None, hetero=True, memory=None):
    rng = np.random.default_rng(seed)
    costs = random_costs(rng, n_layers)
    cl = make_cluster(n_dev, hetero=hetero, memory=memory or (40 * GB, 80 * GB))
    n_stages = len(placement) if placement else n_dev
    return PartitionInstance.build(costs, cl, n_stages, placement or tuple(range(n_dev)),
                                   inflight=[float(n_dev - d) for d in range(n_dev)])


@pytest.mark.parametrize("seed", range(25))
def test_ilp_equals_dp_equals_brute_force(seed):
    rng = np.random.default_rng(1000 + seed)
    n_dev = int(rng.integers(2, 5))
    inst = _instance(seed, int(rng.integers(n_dev, 10)), n_dev, hetero=bool(seed % 2))
    dp, brute = dp_partition(inst), brute_force_partition(inst)
    ilp = solve_instance(inst)
    plain = solve_instance(inst, presolve=False)
    assert dp.objective == pytest.approx(brute.objective, rel=1e-12)
    assert ilp.objective == pytest.approx(brute.objective, rel=1e-7)
    assert plain.objective == pytest.approx(brute.objective, rel=1e-7)
    assert ilp.proven_optimal and plain.proven_optimal
    assert greedy_partition(inst).objective >= brute.objective - 1e-12 or not greedy_partition(inst).fits_memory


@pytest.mark.parametrize("seed", range(6))
def test_ilp_with_several_stages_per_device_matches_brute_force(seed):
    placement = v_placement(2, 2) if seed % 2 else loop_placement(2, 2)
    inst = _instance(seed, 8, 2, placement=placement)
    ilp, brute = solve_instance(inst), brute_force_partition(inst)
    assert ilp.objective == pytest.approx(brute.objective, rel=1e-7)


@pytest.mark.parametrize("seed", range(6))
def test_joint_placement_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n_dev, n_stages = (2, 4) if seed % 2 else (3, 3)
    costs = random_costs(rng, 6)
    cl = make_cluster(n_dev, hetero=True, nodes=n_dev)
    inst = PartitionInstance.build(costs, cl, n_stages, None,
                                   inflight=[float(n_dev - d) for d in range(n_dev)])
    joint = solve_placement_instance(inst)
    brute = brute_force_placement(inst)
    plain = solve_placement_instance(inst, presolve=False)
    assert joint.proven_optimal and plain.proven_optimal
    assert joint.objective == pytest.approx(brute.objective, rel=1e-7)
    assert plain.objective == pytest.approx(brute.objective, rel=1e-7)
    assert sorted(np.bincount(joint.placement)) == [n_stages // n_dev] * n_dev


def test_heterogeneous_devices_get_work_in_proportion_to_speed():
    costs = CostTable.uniform(12, kinds=("slow", "fast"))
    costs = CostTable(costs.layer_names, costs.kinds, np.c_[np.full(12, 2.0), np.ones(12)],
                      np.c_[np.full(12, 2.0), np.ones(12)], np.zeros((12, 2)), costs.act_bytes,
                      costs.static_bytes, costs.out_bytes, costs.params)
    cl = make_cluster(2, hetero=True)
    cl = type(cl)(cl.name, (cl.kinds[0].__class__("slow", 1, 80 * GB, 1), cl.kinds[1].__class__("fast", 1, 80 * GB, 1)),
                  (0, 1), (0, 0), cl.intra_link, cl.inter_link)
    res = solve_partition(costs, cl, 2, (0, 1), inflight=[1, 1])
    assert res.stage_sizes == (4, 8)       # 4 layers × 4 s on the slow device = 8 layers × 2 s
    assert res.objective == pytest.approx(16.0 + cl.intra_link.latency, rel=1e-9)  # + one send


def test_memory_limit_is_honoured_and_moves_the_optimum():
    loose = _instance(3, 10, 3, memory=(1e3 * GB, 1e3 * GB))
    free = dp_partition(loose)
    peak = max(free.device_memory_bytes)
    tight = PartitionInstance.build(loose.costs, loose.cluster, 3, (0, 1, 2), inflight=loose.inflight,
                                    memory_bytes=[peak * 0.8] * 3)
    res = solve_instance(tight)
    assert max(res.device_memory_bytes) <= peak * 0.8 * (1 + 1e-9)
    assert res.objective == pytest.approx(dp_partition(tight).objective, rel=1e-7)
    assert res.objective >= free.objective - 1e-12


def test_infeasible_names_device_and_bytes_short():
    inst = _instance(4, 8, 2, memory=(0.5 * GB, 0.5 * GB))
    with pytest.raises(InfeasibleError) as err:
        solve_instance(inst)
    msg = str(err.value)
    assert "device" in msg and "short" in msg and "recomputation" in msg and "more devices" in msg
    assert dp_partition(inst).status == "infeasible"


def test_inflight_comes_from_the_schedule_formulas():
    costs = CostTable.uniform(16, act_bytes=1.0)
    cl = make_cluster(4, hetero=False)
    inst = PartitionInstance.build(costs, cl, 4, (0, 1, 2, 3), Inflight("1f1b", 8))
    assert inst.inflight == (4.0, 3.0, 2.0, 1.0)     # 1F1B keeps p - rank micro-batches


def test_presolved_and_plain_ilp_agree_on_a_larger_instance():
    inst = _instance(7, 40, 6, hetero=True, memory=(1e3 * GB, 1e3 * GB))
    ref = dp_partition(inst)
    assert solve_instance(inst).objective == pytest.approx(ref.objective, rel=1e-7)
    assert improve_by_shifts(inst, greedy_partition(inst)).objective >= ref.objective - 1e-12


def test_highs_matches_cbc_or_reports_missing_package(monkeypatch):
    inst = _instance(5, 9, 3)
    if backend.highs_available():
        res = solve_instance(inst, SolverConfig(name="highs"))
        assert res.objective == pytest.approx(dp_partition(inst).objective, rel=1e-7)
    monkeypatch.setattr(backend, "highs_available", lambda: False)
    with pytest.raises(SolverUnavailableError, match="pip install highspy"):
        solve_instance(inst, SolverConfig(name="highs"))


def test_bad_solver_config_is_rejected():
    with pytest.raises(ConfigError, match="solver.name"):
        SolverConfig(name="gurobi-ish")
    with pytest.raises(ConfigError, match="time_limit_s"):
        SolverConfig(time_limit_s=0)
