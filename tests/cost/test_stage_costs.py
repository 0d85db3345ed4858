"""StageCosts: the one binding of a CostTable to a partition and placement, and its readers."""
from dataclasses import replace

import numpy as np
import pytest

from octopipe.cluster import Cluster, DeviceKind, Link
from octopipe.cost.action_costs import action_costs
from octopipe.cost.stage_costs import StageCosts
from octopipe.cost.table import CostTable
from octopipe.plan import Partition, Plan
from octopipe.schedule.generators import interleaved
from octopipe.sim.durations import bind
from octopipe.sim.program import compile_table
from octopipe.tune.candidate import Candidate, Problem
from solvers.instance import PartitionInstance


def _case():
    rng = np.random.default_rng(1)
    L = 10
    costs = CostTable(tuple(f"l{j}" for j in range(L)), ("a", "b"), rng.random((L, 2)),
                      rng.random((L, 2)), rng.random((L, 2)), rng.random(L) * 1e6,
                      rng.random(L) * 1e6, rng.random(L) * 1e5, np.zeros(L),
                      w_act_bytes=rng.random(L) * 1e5)
    kinds = (DeviceKind("a", 1e15, 1e12, 1e12), DeviceKind("b", 1e15, 1e12, 1e12))
    cluster = Cluster("c", kinds, (0, 1, 1, 0), (0, 0, 1, 1), Link("in", 1e9, 1e-5),
                      Link("out", 1e8, 1e-4))
    return costs, cluster


def test_each_stage_is_costed_on_its_devices_column():
    costs, cluster = _case()
    part, placement = Partition((3, 2, 1, 4)), (0, 1, 3, 2)
    cols = costs.columns_for(cluster)
    st = StageCosts.bind(costs, part, placement, cols)
    for s, ((lo, hi), d) in enumerate(zip(part, placement)):
        k = cols[d]
        assert st.column[s] == k
        for name in ("f", "i", "w", "work"):
            assert getattr(st, name)[s] == costs.range_sum(name, lo, hi, k)
        assert st.static_bytes[s] == costs.range_sum("static_bytes", lo, hi)
        assert st.out_bytes[s] == costs.out_bytes[hi - 1]
    assert st.work == pytest.approx(st.f + st.i + st.w)
    assert st.per_device(st.static_bytes, 4).sum() == pytest.approx(costs.static_bytes.sum())
    t = st.boundary_transfers(cluster)
    assert t[0] == cluster.transfer_time(0, 1, float(costs.out_bytes[2]))


def test_the_tuner_the_solvers_and_the_simulator_read_the_same_stage_costs():
    costs, cluster = _case()
    part, placement = Partition((3, 2, 1, 4)), (0, 1, 2, 3)
    st = StageCosts.bind(costs, part, placement, costs.columns_for(cluster))
    pb = Problem.build(costs, cluster, 4, 4)
    cand = Candidate(part, placement, split_backward=True)
    arr = pb.arrays(cand)
    assert np.array_equal(arr.dur, np.stack([st.f, st.i, st.w], axis=1))
    assert np.array_equal(pb.device_load(cand), st.per_device(st.work, 4))
    inst = PartitionInstance.build(costs, cluster, 4, placement)
    load, _ = inst.evaluate(part)
    cross = st.boundary_transfers(cluster)
    assert load == pytest.approx(st.work + np.concatenate([cross, [0]]) + np.concatenate([[0], cross]))
    table = interleaved(2, 4, 2)
    prog = compile_table(table)
    dur = bind(prog, part, costs, cluster)
    cols = costs.columns_for(cluster, 2)
    for c in range(prog.n_compute):
        s, d, k = int(prog.c_stage[c]), int(prog.c_dev[c]), int(prog.c_kind[c])
        one = StageCosts.bind(costs, part, table.placement, [cols[d]] * 2)
        want = (one.f, one.i, one.w, one.b)[k][s]
        assert dur.compute[c] == want
    assert Plan(part, table).partition is part


def test_a_measured_full_backward_and_the_host_time_per_action():
    """With a full backward measured below I + W and host seconds per action, every action of a
    stage pays the host time once whatever its layers: F, I, W and B alike; the estimator's
    durations, the simulator's and the per-action costs of a plan agree with that."""
    costs, cluster = _case()
    h = 0.25
    costs = replace(costs, full_b=0.7 * (costs.i + costs.w), action_s=h, _prefix={})
    part, placement = Partition((3, 2, 1, 4)), (0, 1, 3, 2)
    cols = costs.columns_for(cluster)
    st = StageCosts.bind(costs, part, placement, cols)
    for s, ((lo, hi), d) in enumerate(zip(part, placement)):
        k = cols[d]
        for name in ("f", "i", "w"):
            assert getattr(st, name)[s] == costs.range_sum(name, lo, hi, k) + h
        assert st.b[s] == pytest.approx(0.7 * (costs.range_sum("i", lo, hi, k) + costs.range_sum("w", lo, hi, k)) + h)
        assert st.b[s] < st.i[s] + st.w[s]
    pb = Problem.build(costs, cluster, 4, 4)
    whole = pb.arrays(Candidate(part, placement, split_backward=False))
    assert np.array_equal(whole.dur[:, 1], st.b) and not whole.dur[:, 2].any()
    table = interleaved(2, 4, 2)
    plan = Plan(Partition((3, 2, 1, 4)), table)
    per_action = action_costs(plan, costs, costs.columns_for(cluster, 2))
    prog = compile_table(table)
    dur = bind(prog, plan.partition, costs, cluster)
    for c in range(prog.n_compute):
        s, d, k = int(prog.c_stage[c]), int(prog.c_dev[c]), int(prog.c_kind[c])
        one = StageCosts.bind(costs, plan.partition, table.placement, [costs.columns_for(cluster, 2)[d]] * 2)
        assert dur.compute[c] == (one.f, one.i, one.w, one.b)[k][s]
    for d, a in table:
        if not a.kind.is_comm:
            one = StageCosts.bind(costs, plan.partition, table.placement, [costs.columns_for(cluster, 2)[d]] * 2)
            want = {"F": one.f, "I": one.i, "W": one.w, "B": one.b}[a.kind.value][a.stage]
            assert per_action[str(a)] == pytest.approx(want, rel=1e-12)


def test_without_them_a_full_backward_is_i_plus_w_to_the_bit():
    costs, cluster = _case()
    st = StageCosts.bind(costs, Partition((3, 2, 1, 4)), (0, 1, 3, 2), costs.columns_for(cluster))
    assert np.array_equal(st.b, st.i + st.w)
    assert np.array_equal(costs.b, costs.i + costs.w)
