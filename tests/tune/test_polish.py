"""Row moves: an action advanced into a bubble shortens a badly ordered table."""
import pytest

from octopipe.cost.table import CostTable
from octopipe.plan import Plan
from octopipe.schedule.table import ScheduleTable
from octopipe.tune.candidate import Problem
from octopipe.tune.evaluate import simulate_plan
from octopipe.tune.polish import advance_into_bubbles

from .helpers import free_cluster


def test_advance_forward_into_warmup_bubble():
    costs = CostTable.uniform(2, f=1.0, i=1.0, w=1.0)
    pb = Problem.build(costs, free_cluster(2), 2, 2)
    # device 0 waits for 0B0 before starting 0F1: a bubble the F could fill
    bad = ScheduleTable.from_strings([["0F0", "0B0", "0F1", "0B1"], ["1F0", "1B0", "1F1", "1B1"]],
                                     (0, 1), 2)
    plan = Plan(((0, 1), (1, 2)), bad)
    sim = simulate_plan(pb, plan)
    new_plan, new_sim, moves, _ = advance_into_bubbles(pb, plan, sim, max_sims=48)
    assert moves and new_sim.makespan < sim.makespan
    # the 1F1B order for 2 devices, 2 micro-batches: (m + p - 1)(F + B) = 3 * 3
    assert new_sim.makespan == pytest.approx(9.0)
    assert new_plan.table.rows[0][:2] == bad.rows[0][:1] + (bad.rows[0][2],)


def test_no_move_on_a_tight_table():
    costs = CostTable.uniform(2, f=1.0, i=1.0, w=1.0)
    pb = Problem.build(costs, free_cluster(2), 2, 2)
    good = ScheduleTable.from_strings([["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]],
                                      (0, 1), 2)
    plan = Plan(((0, 1), (1, 2)), good)
    sim = simulate_plan(pb, plan)
    new_plan, new_sim, moves, _ = advance_into_bubbles(pb, plan, sim, max_sims=48)
    assert not moves and new_plan is plan and new_sim.makespan == sim.makespan
