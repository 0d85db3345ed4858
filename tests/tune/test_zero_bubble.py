"""Memory-budget plans against zero-bubble's automatic scheduler (`solvers.zb_auto`, an
independent re-implementation): the oracle's own timing equals our simulator's on its order, it
keeps its budget, it reaches the paper's closed forms, and the tuner's plans at 1x and 2x of
1F1B's activations are no worse on the rebuilt 1.5B and 6.2B settings (p = 8, m = 24)."""
import numpy as np
import pytest

from octopipe.measure.bench.zero_bubble import SETTINGS, oracle_plan, setting_cluster, stage_costs, zb_instance
from octopipe.plan import Partition, Plan
from octopipe.schedule.library import build_schedule
from octopipe.sim.simulator import simulate
from octopipe.sim.stage_span import span_bubble_rate, stage_spans
from octopipe.tune import TuneOptions, tune
from octopipe.tune.attribution import from_list_result
from octopipe.tune.candidate import Candidate, Problem
from octopipe.tune.memory_budget import activation_budget
from octopipe.tune.moves import neighbours, warmup_moves
from solvers.zb_auto import ZbInstance, zb_auto_schedule

from .helpers import free_cluster
from .test_memory_budget import hetero_zb_costs, zb_costs

GIB = 2.0**30


def unit_instance(p, m, multiple, comm=0.0):
    return ZbInstance((1.0,) * p, (1.0,) * p, (1.0,) * p, (1.0,) * p, (0.5,) * p,
                      (multiple * p,) * p, comm, m)


def test_stage_span_bubble_of_1f1b_is_its_closed_form():
    p, m = 4, 8
    costs, cl = zb_costs(p), free_cluster(p)
    sim = simulate(Plan(Partition.uniform(p, p), build_schedule("1f1b", p, m)), costs, cl)
    assert stage_spans(sim)[0] == pytest.approx(sim.makespan)
    assert span_bubble_rate(sim) == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("p,m", [(4, 12), (8, 24)])
def test_zb2p_reaches_zero_and_zb1p_a_third_of_1f1b(p, m):
    """The paper's table at T_F = T_B = T_W, no communication: ZB-2p's cost is m(F+B+W) (zero
    bubble), ZB-1p idles at most a third of 1F1B's (p-1)(F+B+W) per stage."""
    two = zb_auto_schedule(unit_instance(p, m, 2.0))
    assert two.cost == pytest.approx(3.0 * m)
    one = zb_auto_schedule(unit_instance(p, m, 1.0))
    assert one.cost - 3.0 * m <= (p - 1) + 1e-9
    assert one.peak_mem.max() <= p + 1e-9 and two.peak_mem.max() <= 2 * p + 1e-9


@pytest.mark.parametrize("seed,multiple", [(0, 1.0), (1, 2.0), (2, 1.5)])
def test_oracle_timing_equals_the_simulator_on_its_order(seed, multiple):
    """Unequal stages with a link delay: our simulator, run on the oracle's order, starts every
    action when the oracle's own timing does, and holds no more than the oracle's budget."""
    p, m, lat = 4, 8, 3e-5
    costs, cl = hetero_zb_costs(p, seed), free_cluster(p, latency=lat)
    budget = multiple * p * float(costs.act_bytes.max())
    inst = ZbInstance(tuple(costs.f.ravel()), tuple(costs.i.ravel()), tuple(costs.w.ravel()),
                      tuple(costs.act_bytes), tuple(costs.w_act_bytes), (budget,) * p, lat, m)
    z = zb_auto_schedule(inst)
    sim = simulate(oracle_plan(inst), costs, cl)
    assert sim.makespan == pytest.approx(z.makespan, rel=1e-9)
    assert np.allclose(stage_spans(sim), z.stage_spans, rtol=1e-9)
    for d in range(p):
        assert sim.memory_trace(d)[1].max() <= budget * (1 + 1e-9)
    assert z.peak_mem.max() <= budget * (1 + 1e-9)


@pytest.mark.parametrize("name,padded", [("1.5B", False), ("6.2B", True)])
def test_budget_plans_are_no_worse_than_zero_bubbles_scheduler(name, padded):
    g = next(s for s in SETTINGS if s.name == name)
    m = 3 * g.stages
    costs, cl = stage_costs(g, padded), setting_cluster(g.stages)
    for multiple in (1.0, 2.0):
        inst = zb_instance(costs, m, multiple, g.comm())
        zb = simulate(oracle_plan(inst), costs, cl)
        res = tune(costs, cl, g.stages, m, TuneOptions(
            {"memory_budget": multiple, "levers": ["schedule"], "max_evaluations": 600}))
        assert res.makespan_s <= zb.makespan * (1 + 1e-9), multiple
        assert span_bubble_rate(res.sim_result) <= span_bubble_rate(zb) + 1e-9, multiple
        assert res.sim_result.peak_activation_memory.max() <= inst.max_mem[0] * (1 + 1e-9)


def test_warmup_offsets_move_one_stage_limit_and_only_under_a_budget():
    p, m = 4, 8
    c = Candidate(Partition.uniform(p, p), tuple(range(p)), True, 1.0)
    assert c.limits(p).tolist() == [4, 3, 2, 1]
    assert c.with_(warmup=(0, 1, 0, -1)).limits(p).tolist() == [4, 4, 2, 1]   # never below 1
    moved = [x.limits(p).tolist() for x, _ in warmup_moves(c, p)]
    assert [5, 3, 2, 1] in moved and [4, 3, 1, 1] in moved and len(moved) == 7
    assert warmup_moves(c.with_(inflight=float("inf")), p) == []
    costs, cl = zb_costs(p), free_cluster(p)
    free = Problem.build(costs, cl, p, m)
    capped = Problem.build(costs, cl, p, m, act_budget=activation_budget(free, 1.0))
    def tags(pb):
        return {t for _, _, t in neighbours(c, pb, from_list_result(pb, c, pb.estimate(c)))}
    assert "warm-up depth" in tags(capped) and "warm-up depth" not in tags(free)
