"""Simulator timing against closed forms and hand-computed cases."""
from __future__ import annotations

import numpy as np
import pytest

from octopipe.cost.table import CostTable
from octopipe.schedule.table import ScheduleTable
from octopipe.sim import Jitter, ReadyFirst, Simulator, simulate
from octopipe.sim.program import compile_table
from tests.sim.conftest import gpipe_table, make_cluster, one_f_one_b_table


@pytest.mark.parametrize("build", [gpipe_table, one_f_one_b_table])
@pytest.mark.parametrize("p,m,f,b", [(2, 2, 1.0, 2.0), (4, 8, 1.0, 2.0), (4, 3, 0.5, 1.5), (8, 16, 2.0, 3.0)])
def test_uniform_free_comm_matches_closed_form(build, p, m, f, b):
    res = Simulator(build(p, m)).uniform(f, b).run()
    assert res.makespan == pytest.approx((m + p - 1) * (f + b))
    assert res.bubble_ratio == pytest.approx((p - 1) / (m + p - 1))
    assert np.allclose(res.busy, m * (f + b))


def test_costtable_stage_sums_give_the_closed_form():
    p, m = 4, 6
    cost = CostTable.uniform(8, f=1.0, i=1.5, w=0.5, act_bytes=10.0, static_bytes=3.0)
    res = simulate(one_f_one_b_table(p, m), cost, make_cluster(p), partition=((0, 2), (2, 4), (4, 6), (6, 8)))
    assert res.makespan == pytest.approx((m + p - 1) * (2.0 + 4.0))


def test_one_f_one_b_first_device_peak_is_p_microbatches_plus_static():
    p, m = 4, 8
    cost = CostTable.uniform(8, act_bytes=10.0, static_bytes=3.0)
    res = simulate(one_f_one_b_table(p, m), cost, make_cluster(p))
    per_stage_act, per_stage_static = 2 * 10.0, 2 * 3.0
    assert res.peak_memory[0] == pytest.approx(p * per_stage_act + per_stage_static)
    assert res.peak_activation_memory.tolist() == pytest.approx([(p - d) * per_stage_act for d in range(p)])
    gp = simulate(gpipe_table(p, m), cost, make_cluster(p))
    assert gp.peak_activation_memory.tolist() == pytest.approx([m * per_stage_act] * p)


def _two_device_gpipe(transfer: float) -> Simulator:
    return Simulator(gpipe_table(2, 2)).uniform(1.0, 2.0, transfer=transfer)


def test_hand_computed_transfers():
    res = _two_device_gpipe(0.5).run()
    a = compile_table(gpipe_table(2, 2))
    starts = {str(a.action(c)): res.start[c] for c in range(a.n_compute)}
    assert starts == {"0F0": 0.0, "0F1": 1.0, "1F0": 1.5, "1F1": 2.5, "1B0": 3.5, "1B1": 5.5,
                      "0B0": 6.0, "0B1": 8.0}
    assert res.makespan == pytest.approx(10.0)


def test_link_direction_carries_one_transfer_at_a_time():
    # transfers of 2s on one link: 0F1's message waits for 0F0's (queued 1s), all else follows
    res = _two_device_gpipe(2.0).run()
    assert sorted(res.transfer_start.tolist()) == [1.0, 3.0, 8.0, 10.0]
    assert res.makespan == pytest.approx(14.0)
    # without contention 1F1 would start at 4 and the makespan would be 13; contention costs 1s
    assert res.bubble_causes[:, 3].sum() > 0


def test_bandwidth_and_latency_from_the_cluster():
    cost = CostTable.uniform(2, f=1.0, i=1.0, w=1.0, out_bytes=100.0)
    res = simulate(gpipe_table(2, 1), cost, make_cluster(2, bandwidth=200.0, latency=0.25))
    # F 1, message 0.25 + 0.5, F 1, B 2, message 0.75, B 2
    assert res.makespan == pytest.approx(1 + 0.75 + 1 + 2 + 0.75 + 2)
    assert res.transfer_end - res.transfer_start == pytest.approx([0.75, 0.75])


def test_colocated_stages_exchange_nothing():
    from octopipe.schedule.action import Action, ActionKind
    F, B = ActionKind.F, ActionKind.B
    rows = [[Action(0, F, 0), Action(1, F, 0), Action(1, B, 0), Action(0, B, 0)]]
    t = ScheduleTable.from_rows(rows, (0, 0), 1)
    res = Simulator(t).uniform(1.0, 2.0, transfer=5.0).run()
    assert res.program.n_transfers == 0
    assert res.makespan == pytest.approx(6.0)


def test_strict_equals_ready_first_when_rows_are_in_readiness_order():
    rng = np.random.default_rng(3)
    for build, p, m in [(one_f_one_b_table, 4, 6), (gpipe_table, 3, 5)]:
        sim = Simulator(build(p, m)).uniform(1.0, 2.0, transfer=0.3)
        dur = sim.durations.scaled(compute=sim.durations.compute * rng.uniform(0.5, 1.5, sim.program.n_compute))
        rf = sim.run(dur, policy="ready_first")
        frozen = Simulator(rf.executed_table())
        again_rf = frozen.run(_remap(sim, frozen, dur), policy="ready_first")
        again_strict = frozen.run(_remap(sim, frozen, dur), policy="strict")
        assert again_strict.makespan == pytest.approx(rf.makespan)
        assert np.allclose(np.sort(again_strict.start), np.sort(rf.start))
        assert np.allclose(again_rf.start, again_strict.start)


def _remap(src: Simulator, dst: Simulator, dur):
    """Carry per-action durations from one compiled table to another (ids differ)."""
    a, b = src.program, dst.program
    index = {str(a.action(c)): c for c in range(a.n_compute)}
    perm = np.array([index[str(b.action(c))] for c in range(b.n_compute)])
    base = Simulator(dst.program).uniform(1.0, 2.0, transfer=0.3).durations
    return base.scaled(compute=dur.compute[perm])


def test_ready_first_beats_strict_on_a_badly_ordered_row():
    # device 1 is told to run micro-batch 1 first, whose input arrives last
    from octopipe.schedule.action import Action, ActionKind
    F, B = ActionKind.F, ActionKind.B
    rows = [[Action(0, F, 0), Action(0, F, 1), Action(0, B, 0), Action(0, B, 1)],
            [Action(1, F, 1), Action(1, B, 1), Action(1, F, 0), Action(1, B, 0)]]
    t = ScheduleTable.from_rows(rows, (0, 1), 2)
    sim = Simulator(t).uniform(1.0, 2.0)
    assert sim.run(policy="ready_first").makespan < sim.run(policy="strict").makespan


def test_in_flight_limit_bounds_activations_and_reports_memory_waits():
    sim = Simulator(gpipe_table(4, 8)).uniform(1.0, 2.0)
    free = sim.run(policy=ReadyFirst("bf"))
    capped = sim.run(policy=ReadyFirst("bf", max_inflight=2))
    assert free.peak_activation_memory.max() == 8
    assert capped.peak_activation_memory.max() <= 2
    assert capped.bubble_causes[:, 4].sum() > 0
    frozen = Simulator(capped.executed_table()).uniform(1.0, 2.0).run()
    assert frozen.makespan == pytest.approx(capped.makespan)


def test_bubble_causes_sum_to_idle_time():
    res = Simulator(one_f_one_b_table(4, 8)).uniform(1.0, 2.0, transfer=0.4).run()
    assert np.allclose(res.bubble_causes.sum(axis=1), res.idle)
    cp = res.critical_path
    assert res.end[cp[-1]] == pytest.approx(res.makespan)


def test_jitter_is_seeded_and_monte_carlo_spreads():
    sim = Simulator(one_f_one_b_table(4, 8)).uniform(1.0, 2.0)
    j = Jitter(cv=0.2)
    a, b = sim.run(jitter=j, seed=7), sim.run(jitter=j, seed=7)
    assert a.makespan == b.makespan
    mc = sim.monte_carlo(20, j, seed=1)
    assert mc.std > 0 and mc.percentile(90) >= mc.percentile(50)
    slow = sim.monte_carlo(5, Jitter(slow_prob=1.0, slow_factor=2.0), seed=1)
    assert slow.mean == pytest.approx(2 * sim.run().makespan)


def test_bfw_hint_defers_weight_gradients_behind_forwards():
    from octopipe.schedule.action import Action, ActionKind
    F, I, W = ActionKind.F, ActionKind.I, ActionKind.W
    rows = [[Action(0, F, 0), Action(0, F, 1), Action(0, I, 0), Action(0, W, 0), Action(0, I, 1), Action(0, W, 1)],
            [Action(1, F, 0), Action(1, I, 0), Action(1, W, 0), Action(1, F, 1), Action(1, I, 1), Action(1, W, 1)]]
    t = ScheduleTable.from_rows(rows, (0, 1), 2)
    sim = Simulator(t).uniform(1.0, 2.0, w=1.0)
    as_table = [str(a) for a in sim.run(policy="ready_first").executed_table().rows[1]]
    bfw = [str(a) for a in sim.run(policy=ReadyFirst("bfw")).executed_table().rows[1]]
    assert as_table == ["1F0", "1I0", "1W0", "1F1", "1I1", "1W1"]
    assert bfw == ["1F0", "1I0", "1F1", "1I1", "1W0", "1W1"]


def test_memory_over_capacity_is_reported_and_an_error_when_checked():
    from octopipe.errors import InfeasibleError
    cost = CostTable.uniform(4, act_bytes=10.0, static_bytes=5.0)
    small = make_cluster(2, memory=50.0)
    res = simulate(gpipe_table(2, 4), cost, small)
    assert res.over_capacity == (0, 1)   # 2 layers x (5 static + 4 x 10 activations) = 90 > 50
    with pytest.raises(InfeasibleError, match="device 0"):
        simulate(gpipe_table(2, 4), cost, small, check_memory=True)
    limited = simulate(gpipe_table(2, 4), cost, small, policy=ReadyFirst(memory_limit=True))
    assert limited.peak_memory.max() <= 50.0 and not limited.over_capacity


def test_replicated_stages_count_static_memory_twice_and_partitions_rebind():
    from octopipe.schedule.library import build_schedule
    from octopipe.sim.durations import bind
    cost = CostTable.uniform(8, f=1.0, i=1.0, w=1.0, static_bytes=1.0)
    chim = simulate(build_schedule("chimera", 4, 4), cost, make_cluster(4))
    gp = simulate(build_schedule("gpipe", 4, 4), cost, make_cluster(4))
    assert chim.static_memory.tolist() == pytest.approx([4.0] * 4)
    assert gp.static_memory.tolist() == pytest.approx([2.0] * 4)
    sim = Simulator(gpipe_table(2, 3))
    even = sim.run(bind(sim.program, ((0, 4), (4, 8)), cost, make_cluster(2)))
    skew = sim.run(bind(sim.program, ((0, 6), (6, 8)), cost, make_cluster(2)))
    assert even.makespan == pytest.approx((3 + 1) * 12.0)
    # stage 0: F 6, B 12; stage 1: F 2, B 4. Device 1's B0 ends at 18 + 2 + 4 = 24, then device
    # 0 runs its three B back to back: 24 + 3 x 12
    assert skew.makespan == pytest.approx(60.0)


def test_device_kinds_take_their_own_cost_column():
    from octopipe.cluster import Cluster, DeviceKind, Link
    cost = CostTable.uniform(2, f=1.0, i=1.0, w=1.0, kinds=("fast", "slow"))
    cost.f[:, 1] *= 3.0
    link = Link("l", 1.0, 0.0)
    kinds = (DeviceKind("fast", 1.0, 1e9, 1.0), DeviceKind("slow", 1.0, 1e9, 1.0))
    cluster = Cluster("hetero", kinds, (0, 1), (0, 0), link, link)
    res = simulate(gpipe_table(2, 1), cost, cluster)
    assert res.makespan == pytest.approx(1 + 3 + 2 + 2)
