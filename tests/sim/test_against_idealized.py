"""With unit stage costs and free communication the simulator must reproduce the idealized table
(octopipe.schedule.idealized, written independently) for every named schedule."""
from __future__ import annotations

import numpy as np
import pytest

from octopipe.schedule.idealized import idealize
from octopipe.schedule.library import SCHEDULES, build_schedule
from octopipe.sim import Simulator


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("p,m", [(4, 8), (2, 4)])
def test_free_comm_unit_costs_match_the_idealized_table(name, p, m):
    try:
        table = build_schedule(name, p, m)
    except Exception as e:  # a shape the schedule does not support
        pytest.skip(str(e).splitlines()[0])
    it = idealize(table, "1:1:1")
    sim = Simulator(table).uniform(1.0, 2.0, w=1.0 if table.splits_backward else None)
    strict = sim.run()
    assert strict.makespan == pytest.approx(it.makespan)
    assert strict.bubble_ratio == pytest.approx(it.bubble_ratio)
    if not table.splits_backward:
        assert np.array_equal(strict.peak_activation_memory, it.peak_inflight())
