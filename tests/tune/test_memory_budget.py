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
