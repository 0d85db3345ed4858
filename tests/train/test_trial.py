"""The plan trial: which candidates a tuning yields, and which one wins."""
from __future__ import annotations

from dataclasses import replace

import pytest

from octopipe.plan import Partition, Plan
from octopipe.schedule.library import build_schedule
from octopipe.sim.simulator import simulate
from octopipe.train.trial import TrialOutcome, median_step, same_plan, trial_candidates, winner
from octopipe.tune import TuneOptions, tune
from octopipe.tune.evaluate import Evaluated
from tests.tune.helpers import free_cluster
from tests.tune.test_tuner import hetero_costs

CFG = {"max_iters": 6, "patience": 3, "ilp": False, "max_evaluations": 60, "finalists": 1}


def test_the_lowest_median_wins_and_the_tuners_plan_wins_a_tie():
    assert winner([0.12, 0.10]) == 1
    assert winner([0.10, 0.12]) == 0
    assert winner([0.10, 0.10]) == 0


def test_the_first_step_warms_up_and_is_not_counted():
    records = [{"step_s": 9.0}, {"step_s": 0.3}, {"step_s": 0.1}, {"step_s": 0.2}]
    assert median_step(records) == pytest.approx(0.2)


def test_same_plan_compares_stages_placement_and_rows():
    a = Plan(Partition.uniform(4, 2), build_schedule("1f1b", 2, 4))
    assert same_plan(a, Plan(Partition.uniform(4, 2), build_schedule("1f1b", 2, 4)))
    assert not same_plan(a, Plan(Partition.uniform(4, 2), build_schedule("gpipe", 2, 4)))
    assert not same_plan(a, Plan(Partition((1, 3)), build_schedule("1f1b", 2, 4)))


def _evaluated(name: str, plan: Plan, costs, cluster, feasible: bool = True) -> Evaluated:
    return Evaluated(name, "uniform", plan, simulate(plan, costs, cluster), feasible)


def test_candidates_are_the_tuners_plan_and_the_fastest_feasible_named_schedule():
    costs, cluster = hetero_costs(), free_cluster(2)
    res = tune(costs, cluster, 2, 4, TuneOptions(CFG, seed=0))
    even = Partition.uniform(costs.n_layers, 2)
    lopsided = Partition((1, costs.n_layers - 1))
    slow = _evaluated("lopsided", Plan(lopsided, build_schedule("1f1b", 2, 4)), costs, cluster)
    fast = _evaluated("1f1b", Plan(even, build_schedule("1f1b", 2, 4)), costs, cluster)
    infeasible = replace(fast, name="x", feasible=False)
    assert fast.makespan_s < slow.makespan_s
    if same_plan(fast.plan, res.plan):
        pytest.skip("the tuner returned the named schedule itself")
    got = trial_candidates(replace(res, baselines=[slow, infeasible, fast]), 4)
    assert [(n, p) for n, p, _ in got] == [(res.plan.table.name, res.plan), ("1f1b", fast.plan)]
    assert got[0][2] == res.makespan_s and got[1][2] == fast.makespan_s
    assert trial_candidates(replace(res, baselines=[slow, fast]), 0) == ()          # train.trial_steps=0
    assert trial_candidates(replace(res, baselines=[replace(fast, plan=res.plan)]), 4) == ()   # nothing to try
    assert trial_candidates(replace(res, baselines=[]), 4) == ()


def test_the_outcome_names_the_winner_in_its_record_and_line():
    out = TrialOutcome(("octopipe", "S-1F1B"), (0.05, 0.06), (0.09, 0.08), 4, 1)
    assert out.record() == {"candidates": ["octopipe", "S-1F1B"], "predicted_iteration_s": [0.05, 0.06],
                            "measured_step_s": [0.09, 0.08], "steps": 4, "chosen": "S-1F1B"}
    assert out.line().endswith("training S-1F1B")
