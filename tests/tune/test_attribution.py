"""Bubble attribution: causes sum to idle time and land where a hand-made timeline puts them."""
import numpy as np
import pytest

from octopipe.cost.table import CostTable
from octopipe.tune.attribution import CAUSES, attribute, from_list_result
from octopipe.tune.candidate import Candidate, Problem

from .helpers import free_cluster


def test_hand_made_timeline():
    # device 0: runs [0,2), then waits for an input whose producer ends at 3 and arrives at 4,
    # runs [4,6); device 1: runs [2,3) and [3,4), then nothing until the makespan 6.
    dev = np.array([0, 0, 1, 1])
    start = np.array([0.0, 4.0, 2.0, 3.0])
    end = np.array([2.0, 6.0, 3.0, 4.0])
    ready = np.array([0.0, 4.0, 2.0, 3.0])
    pred_end = np.array([0.0, 3.0, 2.0, 3.0])
    a = attribute(2, dev, start, end, ready, pred_end)
    assert a.makespan == 6.0
    assert a.busy.tolist() == [4.0, 2.0]
    assert a.transfer.tolist() == [1.0, 0.0]        # [3, 4): message in flight
    assert a.edges[0] == pytest.approx(1.0)         # [2, 3): producer still computing
    assert a.imbalance.tolist() == [0.0, 2.0]       # device 1 has 2 s less work
    assert a.edges[1] == pytest.approx(2.0)         # the rest of its 4 s idle: fill/drain
    total = sum(getattr(a, c) for c in CAUSES)
    assert np.allclose(total, a.idle)


def test_held_back_action_counts_as_memory():
    # device 0 idles in [1, 3) although its later action was ready at 1.5 (held by a limit)
    dev = np.array([0, 0, 0])
    start = np.array([0.0, 3.0, 4.0])
    end = np.array([1.0, 4.0, 5.0])
    ready = np.array([0.0, 3.0, 1.5])
    pred_end = ready.copy()
    a = attribute(1, dev, start, end, ready, pred_end)
    assert a.memory[0] == pytest.approx(1.5)
    assert a.edges[0] + a.transfer[0] == pytest.approx(0.5)


def test_list_result_attribution_sums_to_idle():
    costs = CostTable.uniform(8, f=1.0, i=1.0, w=1.0)
    costs = CostTable(costs.layer_names, costs.kinds, costs.f * np.arange(1, 9)[:, None], costs.i,
                      costs.w, costs.act_bytes, costs.static_bytes, costs.out_bytes + 1.0,
                      costs.params)
    pb = Problem.build(costs, free_cluster(4, latency=0.3), 4, 6)
    c = Candidate((2, 2, 2, 2), (0, 1, 2, 3))
    r = pb.estimate(c)
    a = from_list_result(pb, c, r)
    assert a.makespan == pytest.approx(r.makespan)
    assert np.allclose(sum(getattr(a, k) for k in CAUSES), a.idle)
    assert a.transfer.sum() > 0                     # the 0.3 s links show up
    assert a.largest()[0] in CAUSES


def test_the_tuners_causes_are_groups_of_the_simulators():
    from octopipe.plan import Partition, Plan
    from octopipe.schedule.library import build_schedule
    from octopipe.sim import simulate
    from octopipe.sim.sim_result import CAUSES as SIM_CAUSES
    from octopipe.sim.sim_result import DEPENDENCY, BubbleCause
    from octopipe.tune.attribution import attribute_sim
    costs = CostTable.uniform(8, f=1.0, i=1.0, w=1.0, out_bytes=1e9)
    table = build_schedule("zbh1", 4, 6)
    sim = simulate(Plan(Partition.uniform(8, 4), table), costs, free_cluster(4, latency=0.2, bandwidth=1e10))
    a = attribute_sim(sim)
    bc = sim.bubble_causes
    assert tuple(c.value for c in BubbleCause) == SIM_CAUSES
    assert np.allclose(a.imbalance + a.edges, sum(bc[:, c.column] for c in DEPENDENCY))
    assert np.array_equal(a.transfer, bc[:, BubbleCause.WAIT_TRANSFER.column])
    assert np.array_equal(a.memory, bc[:, BubbleCause.MEMORY.column])
    assert np.allclose(sum(getattr(a, k) for k in CAUSES), sim.idle)
