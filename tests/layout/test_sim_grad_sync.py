"""Data-parallel gradient sync on the simulator's timeline against closed forms on tiny cases."""
import numpy as np
import pytest

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
