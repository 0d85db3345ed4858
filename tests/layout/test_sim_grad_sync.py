"""Data-parallel gradient sync on the simulator's timeline against closed forms on tiny cases."""
import numpy as np
import pytest

from octopipe.cluster import Cluster, DeviceKind, Link
from octopipe.cost.analytic import AnalyticCostModel
from octopipe.cost.collectives import dp_sync_seconds
from octopipe.model.layer import LayerKind, LayerSpec
from octopipe.model.spec import ModelSpec
from octopipe.plan import Partition, Plan
from octopipe.schedule.library import build_schedule
from octopipe.sim import Simulator
from octopipe.sim.durations import with_grad_sync
from tests.sim.conftest import one_f_one_b_table


@pytest.mark.parametrize("overlap", [True, False])
def test_one_f_one_b_sync_follows_each_stage_last_backward(overlap):
    p, m, f, b, g = 4, 8, 1.0, 2.0, 0.5
    sim = Simulator(one_f_one_b_table(p, m)).uniform(f, b)
    base = sim.run()
    t = (m + p - 1) * (f + b)
    assert base.makespan == pytest.approx(t) and base.grad_sync_end.size == 0
    res = sim.run(with_grad_sync(sim.durations, [g] * p, overlap))
    # device d's last backward ends (p - 1 - ... ) d backward slots before the end
    assert res.grad_sync_end.tolist() == pytest.approx([t - d * b + g for d in range(p)])
    assert res.makespan == pytest.approx(t + g)
    assert np.allclose(res.busy, base.busy)          # communication, not compute


def test_interleaved_sync_overlaps_the_cool_down_or_waits_for_it():
    d, m, f, b = 2, 4, 1.0, 2.0
    table = build_schedule("interleaved", d, m, chunks=2)
    sim = Simulator(table).uniform(f, b)
    base = sim.run()
    t = base.makespan
    p = sim.program
    last_bwd = [float(base.end[(p.c_stage == s) & (p.c_kind > 0)].max()) for s in range(4)]
    assert last_bwd[0] == pytest.approx(t)            # stage 0 (device 0) finishes the iteration
    for g in (0.25, 6.0):
        ov = sim.run(with_grad_sync(sim.durations, [g] * 4, True))
        # device 0 holds stages 0 and 2: stage 2 syncs when its backward ends, stage 0 after both
        assert ov.makespan == pytest.approx(max(t, last_bwd[2] + g) + g)
        no = sim.run(with_grad_sync(sim.durations, [g] * 4, False))
        assert no.makespan == pytest.approx(t + 2 * g)
        assert no.makespan >= ov.makespan


def test_tp_collectives_and_dp_sync_in_the_iteration_closed_form():
    """4 identical MLP layers, 2 stages, 1F1B, free pipeline links: the iteration is
    (m + p - 1)(F + B) with F, B holding the TP all-reduces, plus the first stage's DP sync."""
    h, f, s, p, m, tp, dp = 1024, 4096, 2048, 2, 4, 4, 2
    model = ModelSpec("mlps", tuple(LayerSpec(LayerKind.MLP, h, ffn=f) for _ in range(4)), s, 1)
    nv, free = Link("nv", 450e9, 3e-6), Link("free", 1e30, 0.0)
    dev = DeviceKind("H100-SXM", 989.4e12, 80e9, 3350e9)
    cl = Cluster("c", (dev,), (0, 0), (0, 1), nv, free)
    on = AnalyticCostModel(tp=tp, dp=dp, zero=1).table(model, cl)
    off = AnalyticCostModel(tp=tp, dp=dp, zero=1, tp_collectives=False).table(model, cl)
    ar = 2 * (tp - 1) * 3e-6 + 2 * (tp - 1) / tp * 2.0 * s * h / 450e9     # one ring all-reduce
    plan = Plan(Partition.uniform(4, p), one_f_one_b_table(p, m))
    sim = Simulator(plan, on, cl)
    stage_f = 2 * (off.f[0, 0] + ar)
    stage_b = 2 * (off.i[0, 0] + ar + off.w[0, 0])
    t = (m + p - 1) * (stage_f + stage_b)
    assert sim.run().makespan == pytest.approx(t, rel=1e-9)
    g = dp_sync_seconds(2 * model.layers[0].ffn * h * 3 / tp, dp, nv, zero=1)   # 2 layers of 3hf
    assert g == pytest.approx(2 * ((dp - 1) * 3e-6) + (dp - 1) / dp * (2 * 3 * h * f / tp) * (4 + 2) / 450e9)
    res = sim.run(with_grad_sync(sim.durations, [g, g], overlap=True))
    assert res.makespan == pytest.approx(t + g, rel=1e-9)
