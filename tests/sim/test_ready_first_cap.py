"""ready_first's default cap (`max_inflight="plan"`): each device holds at most its own row's need."""
from __future__ import annotations

import pytest

from octopipe.config.sim import SimConfig
from octopipe.errors import ConfigError
from octopipe.modes.simulate import run_options
from octopipe.schedule.library import build_schedule
from octopipe.sim.hints import PLAN, cap_problem, row_caps, row_need
from octopipe.sim.simulator import ReadyFirst, Simulator


def _held(sim: Simulator, policy) -> list[int]:
    """Per device, the most micro-batches live at once in the order it actually ran."""
    ran = sim.run(policy=policy).executed_table().compute_only()
    return [row_need(ran.actions(d)) for d in range(ran.n_devices)]


@pytest.mark.parametrize("name", ["1f1b", "zbh1"])
def test_uncapped_ready_first_runs_ahead_and_the_default_holds_exactly_the_rows_need(name):
    """A forward placed after a backward whose gradient has not returned runs early without a cap
    (rank 0 holds 5 where its row holds 2); the default cap holds each rank at its row's need, and
    the simulated peak memory is the strict run's."""
    table = build_schedule(name, 2, 8)
    sim = Simulator(table).uniform(1.0, 2.0, transfer=0.5)
    need = [row_need(table.actions(d)) for d in range(2)]
    assert need == [2, 1]
    assert _held(sim, ReadyFirst("table", None)) == [5, 1]
    for policy in ("ready_first", ReadyFirst(), ReadyFirst("bf"), ReadyFirst("table", need)):
        assert _held(sim, policy) == need, policy
    assert list(sim.run(policy=ReadyFirst()).peak_memory) == list(sim.run(policy="strict").peak_memory)
    assert list(sim.run(policy=ReadyFirst("table", None)).peak_memory) != list(sim.run(policy="strict").peak_memory)


def test_the_row_caps_and_their_deadlock_check():
    """`plan` is each row's need, never refused; per-rank caps below a row's need are refused
    where the admission orders conflict (Chimera), naming the rank."""
    chim = build_schedule("chimera", 2, 2)
    rows = [chim.compact().compute_only().actions(d) for d in range(2)]
    assert row_caps(rows, PLAN) == (2, 2) and row_caps(rows, 3) == (3, 3) and row_caps(rows, None) is None
    assert cap_problem(rows, PLAN, False) is None and cap_problem(rows, (2, 3), False) is None
    assert "give rank 0 at least 2" in cap_problem(rows, (1, 2), False)
    assert "use max_inflight >= 2" in cap_problem(rows, 1, False)
    with pytest.raises(ConfigError, match="'rows'"):
        row_caps(rows, "rows")
    with pytest.raises(ConfigError, match="'rows'"):
        Simulator(chim).uniform().run(policy=ReadyFirst(max_inflight="rows"))


def test_sim_max_inflight_defaults_to_the_plan_and_null_lifts_it():
    table = build_schedule("1f1b", 2, 8)
    sim = Simulator(table).uniform(1.0, 2.0, transfer=0.5)
    capped = run_options(SimConfig(policy="ready_first"))["policy"]
    free = run_options(SimConfig(policy="ready_first", max_inflight=None))["policy"]
    assert capped.max_inflight == PLAN and _held(sim, capped) == [2, 1] and _held(sim, free) == [5, 1]
