"""tuner.objective=mean|quantile: finalists scored by Monte Carlo simulation on common random
numbers; and the memory-aware lower bound the summary reports."""
from __future__ import annotations

import numpy as np
import pytest

from octopipe.config.tuner import TunerConfig
from octopipe.plan import Partition, Plan
from octopipe.schedule.library import build_schedule
from octopipe.sim.simulator import Simulator
from octopipe.sim.variability import Variability
from octopipe.tune import TuneOptions, tune
from octopipe.tune.candidate import Problem
from octopipe.tune.robust import Robust

from .helpers import free_cluster
from .test_tuner import hetero_costs

FAST = {"max_evaluations": 300, "ilp": False, "samples": 8}


def _tune(objective: str, cv: float, dispatch: str = "strict", seed: int = 0, **kw):
    costs = hetero_costs(10)
    strag = 0.05 if cv > 0 else 0.0
    var = (lambda plan: Variability(cv=cv, straggler_prob=strag, straggler_factor=3.0))
    return tune(costs, free_cluster(3), 3, 6,
                TuneOptions(TunerConfig(objective=objective, dispatch=dispatch, **FAST, **kw), seed=seed,
                            variability=var))


def test_the_same_seed_gives_the_same_robust_plan():
    a, b = _tune("mean", 0.3), _tune("mean", 0.3)
    assert a.plan.table.rows == b.plan.table.rows and a.plan.partition == b.plan.partition
    assert a.plan.meta["robust"]["score_s"] == b.plan.meta["robust"]["score_s"]


def test_the_robust_choice_scores_no_worse_than_the_nominal_choice():
    r = _tune("quantile", 0.4, quantile=0.75)
    rec = r.search_stats["robust"]
    assert rec["objective"] == "quantile" and rec["candidates"] >= 2
    assert rec["score_s"] <= rec["nominal_choice_score_s"]
    s = r.summary()
    assert s["objective"] == "quantile" and s["robust_score_s"] == r.plan.meta["robust"]["score_s"]


def test_without_variability_the_score_is_the_nominal_makespan():
    r = _tune("mean", 0.0)
    assert r.plan.meta["robust"]["score_s"] == pytest.approx(r.makespan_s, rel=1e-12)
    assert r.makespan_s == pytest.approx(_tune("nominal", 0.0).makespan_s, rel=1e-12)


def test_common_random_numbers_and_the_quantile():
    costs = hetero_costs(10)
    problem = Problem.build(costs, free_cluster(2), 2, 4)
    plan = Plan(Partition.uniform(10, 2), build_schedule("1f1b", 2, 4))
    rb = Robust("quantile", 0.5, 16, "strict", lambda p: Variability(cv=0.3), seed=7)
    a, b = rb.spans(problem, plan), rb.spans(problem, plan)
    assert np.array_equal(a, b) and a.std() > 0
    assert rb.score(a) == pytest.approx(float(np.median(a)))
    other = Robust("quantile", 0.5, 16, "strict", lambda p: Variability(cv=0.3), seed=8).spans(problem, plan)
    assert not np.array_equal(a, other)


def test_one_span_is_the_sample_of_its_seed_and_host_time_lengthens_every_action():
    """`span_of` draws as `spans` does (sample k is seed (seed, k)); with `host_s` each compute
    node is that much longer (strict 1F1B on 2 ranks, 4 micro-batches: every path from rank 0's
    first F to its last B holds at least its row's 8 actions, so the makespan grows by 8·host_s
    or more)."""
    costs = hetero_costs(10)
    problem = Problem.build(costs, free_cluster(2), 2, 4)
    plan = Plan(Partition.uniform(10, 2), build_schedule("1f1b", 2, 4))
    rb = Robust("mean", 0.9, 3, "strict", lambda p: Variability(cv=0.3), seed=7)
    sim = Simulator(plan, problem.costs, problem.cluster)
    spans = rb.spans(problem, plan)
    assert [rb.span_of(sim, plan, "table", (7, k)) for k in range(3)] == list(spans)
    host = 1e-3 * float(spans[0])
    assert rb.span_of(sim, plan, "table", (7, 0), host) >= spans[0] + 8 * host * (1 - 1e-12)


def test_ready_first_records_the_hint_it_runs_best_with():
    r = _tune("mean", 0.5, dispatch="ready_first")
    assert r.plan.meta["robust"]["hint"] in ("table", "bf", "bfw")
    assert r.plan.meta["robust"]["dispatch"] == "ready_first"


@pytest.mark.parametrize("seed", range(3))
def test_the_memory_lower_bound_is_below_every_plan(seed):
    """The bound must hold for the chosen plan and for every feasible baseline (all are plans)."""
    costs = hetero_costs(9, seed=seed)
    act = float(costs.act_bytes.max())
    r = tune(costs, free_cluster(3, memory_bytes=4 * act + 2 ** 31), 3, 8,
             TuneOptions(TunerConfig(max_evaluations=300, ilp=False), seed=seed))
    bound = r.summary()["memory_lower_bound_s"]
    assert 0 < bound <= r.makespan_s * (1 + 1e-12)
    assert all(bound <= b.makespan_s * (1 + 1e-12) for b in r.baselines if b.feasible)
    assert bound >= r.lower_bound_s * (1 - 1e-12)
