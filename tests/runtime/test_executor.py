"""Multi-process runs (gloo on 127.0.0.1) against the single-process reference."""
from __future__ import annotations

import pytest

from octopipe.plan import uniform_partition
from octopipe.runtime.launch import execute
from octopipe.runtime.stage import max_rel_err, reference_run
from octopipe.schedule.table import ScheduleTable, v_placement
from tests.runtime import tiny
from tests.runtime.random_tables import random_table

RTOL = 1e-5


def check(model, table, dispatch="ready_first", iterations=1, lr=0.0, partition=None):
    partition = partition or uniform_partition(model.n_layers, table.n_stages)
    got = execute(model, partition, table, dispatch=dispatch, iterations=iterations, lr=lr, timeout_s=60)
    ref = reference_run(model, table.n_microbatches, iterations=iterations, lr=lr)
    assert max_rel_err(got.grads, ref.grads) <= RTOL
    for a, b in zip(got.losses, ref.losses):
        assert a == pytest.approx(b, rel=RTOL)
    return got


@pytest.mark.parametrize("dispatch", ["strict", "ready_first"])
def test_random_irregular_tables_are_exact_and_never_hang(dispatch):
    model = tiny.hybrid()
    for seed in range(3):
        table = random_table(n_devices=3, n_stages=5, n_microbatches=3, seed=seed)
        check(model, table, dispatch)


def test_v_shape_with_split_backward_on_a_vision_language_model():
    model = tiny.vlm()
    table = random_table(2, 4, 4, seed=7, split_prob=1.0, placement=v_placement(2, 2))
    check(model, table, "strict")


def test_several_sgd_steps_give_the_reference_losses():
    model = tiny.dense(2)
    table = random_table(2, 3, 2, seed=1, placement=(0, 1, 0))
    got = check(model, table, iterations=3, lr=0.5)
    assert got.losses[0] != pytest.approx(got.losses[-1], rel=1e-3)
