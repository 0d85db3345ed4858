"""tuner.memory_budget: plans hold at most the budget of activations on every device (the
simulator's memory trace), more budget never hurts, the zero-bubble hand-made schedules are
never better, and a budget no plan fits says which layer or device is short and by how much."""
import numpy as np
import pytest

from octopipe.cost.table import CostTable
from octopipe.errors import InfeasibleError
from octopipe.plan import Partition, Plan
from octopipe.schedule.library import build_schedule
from octopipe.sim.simulator import simulate
from octopipe.tune import TuneOptions, tune
from octopipe.tune.candidate import Problem
from octopipe.tune.memory_budget import activation_budget
from octopipe.tune.polish import w_instance
from solvers.w_placement import place_ws

from .helpers import free_cluster

GIB = 2.0**30
CFG = {"max_iters": 30, "patience": 8, "max_evaluations": 800, "ilp": False}


def zb_costs(n=8, f=1.0, i=1.0, w=1.0):
    """Identical layers, zero-bubble's memory model: F stores 1 GiB, W needs half of it after I."""
    c = CostTable.uniform(n, f=f * 1e-3, i=i * 1e-3, w=w * 1e-3, act_bytes=GIB)
    return CostTable(c.layer_names, c.kinds, c.f, c.i, c.w, c.act_bytes, c.static_bytes,
                     c.out_bytes, c.params, w_act_bytes=np.full(n, 0.5 * GIB),
                     tokens_per_microbatch=1024)


@pytest.mark.parametrize("multiple", [1.0, 2.0])
def test_plans_stay_within_the_budget_in_the_memory_trace(multiple):
    p, m = 4, 8
    costs, cl = zb_costs(), free_cluster(p, latency=2e-5)
    res = tune(costs, cl, p, m, TuneOptions({**CFG, "memory_budget": multiple}))
    budget = multiple * p * (costs.act_bytes[0] * 2)      # 1F1B: stage 0 keeps p micro-batches of 2 layers
    sim = res.sim_result
    for d in range(p):
        _, held = sim.memory_trace(d)
        assert held.max() <= budget * (1 + 1e-9), d
        assert held.max() == pytest.approx(sim.peak_activation_memory[d])
        assert held[-1] == pytest.approx(0.0, abs=1.0)    # every W freed what F stored
    hand = {"zbh1": 1.0, "zbh2": 2.0}
    for name, need in hand.items():
        if need <= multiple:
            zb = simulate(Plan(Partition.uniform(8, p), build_schedule(name, p, m)), costs, cl)
            assert res.makespan_s <= zb.makespan * (1 + 1e-9), name


def test_more_budget_never_hurts_much_and_splits_backward():
    p, m = 4, 8
    costs, cl = zb_costs(), free_cluster(p, latency=2e-5)
    one = tune(costs, cl, p, m, TuneOptions({**CFG, "memory_budget": 1.0}))
    two = tune(costs, cl, p, m, TuneOptions({**CFG, "memory_budget": 2.0}))
    assert two.makespan_s <= one.makespan_s * (1 + 1e-9)
    assert two.sim_result.bubble_ratio < one.sim_result.bubble_ratio + 1e-9


def test_a_budget_below_one_layer_names_the_layer_and_the_shortfall():
    costs, cl = zb_costs(), free_cluster(4)
    with pytest.raises(InfeasibleError, match=r"layer 0 .* short by"):
        tune(costs, cl, 4, 8, TuneOptions({**CFG, "memory_budget": 0.05}))


def hetero_zb_costs(p, seed):
    """One layer per stage with unequal F, I, W and activations (no fixed family is optimal)."""
    rng = np.random.default_rng(seed)
    f, i, w = (rng.uniform(0.5, 2.0, (p, 1)) * 1e-3 for _ in range(3))
    act = rng.uniform(0.5, 1.5, p) * GIB
    return CostTable(tuple(f"l{j}" for j in range(p)), ("dev",), f, i, w, act, np.zeros(p),
                     np.zeros(p), np.zeros(p), w_act_bytes=0.5 * act, tokens_per_microbatch=1)


@pytest.mark.parametrize("p,m,seed,multiple", [(2, 4, 0, 1.0), (3, 6, 1, 2.0), (4, 8, 2, 1.0),
                                               (4, 8, 3, 2.0)])
def test_heuristic_w_placement_is_within_one_percent_of_the_ilp(p, m, seed, multiple):
    """The search alone (no ILP polish): the exact W placement for its own F/I order gains < 1%."""
    costs, cl = (zb_costs(p) if seed % 2 == 0 else hetero_zb_costs(p, seed)), free_cluster(p)
    res = tune(costs, cl, p, m, TuneOptions({**CFG, "memory_budget": multiple, "levers": ["schedule"],
                                             "w_ilp_max_actions": 0}))
    plan = res.plan
    if not plan.table.splits_backward:
        pytest.skip("the best plan runs a full backward: no W to place")
    pb = Problem.build(costs, cl, p, m)
    pb = Problem.build(costs, cl, p, m, act_budget=activation_budget(pb, multiple))
    ilp = place_ws(w_instance(pb, plan))
    assert ilp.proven_optimal
    assert ilp.makespan <= res.makespan_s * (1 + 1e-6)
    assert res.makespan_s <= ilp.makespan * 1.01


def test_no_plan_within_the_budget_names_the_short_device():
    """1.2 GiB per device fits one layer's 1 GiB, but 8 layers on 4 devices put 2 on some device."""
    costs, cl = zb_costs(), free_cluster(4)
    with pytest.raises(InfeasibleError, match=r"device \d needs 2 GiB .*short by 819 MiB"):
        tune(costs, cl, 4, 8, TuneOptions({**CFG, "memory_budget": 0.15}))
