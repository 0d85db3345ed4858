"""Pinning ranks to cores (the fidelity benchmark's measurement setting)."""
from __future__ import annotations

import pytest

from octopipe.errors import ScheduleError
from octopipe.plan import uniform_partition
from octopipe.runtime.launch import execute
from octopipe.runtime.pinning import core_ids, pin_map
from octopipe.runtime.stage import max_rel_err, reference_run
from octopipe.schedule.library import build_schedule
from tests.runtime import tiny


def test_a_core_list_that_does_not_match_the_ranks_is_rejected_before_any_process_starts():
    table = build_schedule("1f1b", 2, 2)
    with pytest.raises(ScheduleError, match="one core per rank"):
        execute(tiny.job(None, uniform_partition(4, 2), table, compute="emulated", pinned=(0,)))


@pytest.mark.slow
def test_ranks_pinned_two_to_a_core_still_train_exactly():
    model = tiny.hybrid()
    table = build_schedule("1f1b", 4, 4)
    got = execute(tiny.job(model, uniform_partition(model.n_layers, 4), table, dispatch="strict",
                           pinned=pin_map(4, core_ids()[:2]), timeout_s=60))
    ref = reference_run(model, 4)
    assert max_rel_err(got.grads, ref.grads) <= 1e-5
    assert got.losses[0] == pytest.approx(ref.losses[0], rel=1e-5)


def test_pin_map_is_round_robin_over_the_given_cores():
    assert pin_map(4, [3, 5]) == (3, 5, 3, 5)
    assert pin_map(2, [0, 1, 2]) == (0, 1)
