"""SMT memory feasibility: exact against the simulator's peak when no message is in flight,
and a readable counterexample when a device overflows."""
from __future__ import annotations

import numpy as np
import pytest

from octopipe.cost.table import CostTable
from octopipe.plan import Plan, uniform_partition
from octopipe.schedule.library import build_schedule
from octopipe.schedule.lower import lower
from octopipe.schedule.table import ScheduleTable
from octopipe.sim.simulator import simulate
from solvers.instance import Inflight, PartitionInstance
from solvers.partition_ilp import solve_instance
from solvers.smt.memory import check_memory_feasible
from tests.solvers.instances import make_cluster, random_costs


@pytest.mark.parametrize("name,p,m", [("1f1b", 4, 6), ("zbh1", 3, 5), ("interleaved", 2, 4)])
def test_capacity_at_the_simulated_peak_is_exactly_feasible(name, p, m):
    table = lower(build_schedule(name, p, m))
    costs = CostTable.uniform(2 * table.n_stages, act_bytes=1e9, static_bytes=5e8, out_bytes=0.0)
    costs = CostTable(costs.layer_names, costs.kinds, costs.f, costs.i, costs.w, costs.act_bytes,
                      costs.static_bytes, costs.out_bytes, costs.params,
                      w_act_bytes=np.full(costs.n_layers, 2.5e8))
    part = uniform_partition(costs.n_layers, table.n_stages)
    cl = make_cluster(p, hetero=False)
    peak = simulate(Plan(part, table), costs, cl).peak_memory
    ok = check_memory_feasible(table, costs, part, capacity=peak)
    assert ok.ok
    assert np.allclose(ok.witness["peak_memory_bytes"], peak)
    tight = peak.copy()
    tight[1] -= 1e6
    bad = check_memory_feasible(table, costs, part, capacity=tight)
    assert not bad.ok
    assert "device 1" in bad.explanation and ">" in bad.grid


def test_messages_in_flight_count_on_the_sender_then_the_receiver():
    # one micro-batch: device 0 holds its activation and the 4 GB message at its SEND; device 1
    # holds the message from its arrival until F starts, and its own gradient message later
    rows = [["0F0", "0SEND_F0", "0RECV_B0", "0B0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]]
    table = ScheduleTable.from_strings(rows, (0, 1), 1)
    costs = CostTable.uniform(2, act_bytes=1e9, static_bytes=0.0, out_bytes=4e9)
    part = ((0, 1), (1, 2))
    assert check_memory_feasible(table, costs, part, capacity=[5e9, 4e9]).ok
    assert not check_memory_feasible(table, costs, part, capacity=[5e9 - 1, 4e9]).ok
    assert not check_memory_feasible(table, costs, part, capacity=[5e9, 4e9 - 1]).ok


def test_timing_choices_are_searched():
    # two micro-batches: when each message arrives decides which device holds it; the solver
    # finds the execution where the crossing messages never pile up on one device
    rows = [["0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"],
            ["1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1", "1SEND_B1"]]
    table = ScheduleTable.from_strings(rows, (0, 1), 2)
    costs = CostTable.uniform(2, act_bytes=1e9, static_bytes=0.0, out_bytes=4e9)
    part = ((0, 1), (1, 2))
    ok = check_memory_feasible(table, costs, part, capacity=[6e9, 4e9])
    assert ok.ok and ok.witness["peak_memory_bytes"] == [6e9, 4e9]
    assert not check_memory_feasible(table, costs, part, capacity=[6e9 - 1, 1e12]).ok
    assert not check_memory_feasible(table, costs, part, capacity=[1e12, 4e9 - 1]).ok


def test_deadlocked_table_is_not_memory_feasible():
    rows = [["0F0", "0RECV_B0", "0B0", "0SEND_F0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]]
    table = ScheduleTable.from_strings(rows, (0, 1), 1)
    v = check_memory_feasible(table, CostTable.uniform(2), ((0, 1), (1, 2)), capacity=[1e12, 1e12])
    assert not v.ok and "no execution runs to the end" in v.explanation


def test_ilp_plan_stays_within_memory_in_the_simulator():
    rng = np.random.default_rng(3)
    costs = random_costs(rng, 24)
    p, m = 4, 8
    cl = make_cluster(p, hetero=True, memory=(1e12, 1e12))
    free = solve_instance(PartitionInstance.build(costs, cl, p, tuple(range(p)), Inflight("1f1b", m)))
    limit = 0.85 * max(free.device_memory_bytes)
    inst = PartitionInstance.build(costs, cl, p, tuple(range(p)), Inflight("1f1b", m),
                                   memory_bytes=[limit] * p)
    res = solve_instance(inst)
    table = build_schedule("1f1b", p, m)
    sim = simulate(Plan(res.partition, table), costs, cl)
    assert np.all(sim.peak_memory <= limit * (1 + 1e-9))
    assert np.allclose(sim.peak_memory, res.device_memory_bytes)
