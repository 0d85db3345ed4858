"""The asynchronous runtime (torch.distributed, gloo, CPU) equals its single-process replay:
the loss of every micro-batch and the final weights, rtol 1e-5 in fp32, on every layer kind of
the tiny presets, with full and split backward; no flush (one stream, updates per backward)."""
from dataclasses import replace

import pytest
import torch

from octopipe.asynchronous.runtime import WeightStash, replay
from octopipe.asynchronous.tables import async_schedule, schedule_versions
from octopipe.plan import uniform_partition
from octopipe.runtime.launch import execute
from octopipe.schedule.action import Action, I, W
from octopipe.schedule.table import ScheduleTable
from tests.runtime import tiny

LR = 0.05


def split(table: ScheduleTable, name: str) -> ScheduleTable:
    """The table with every B replaced by I then W (split backward, same order)."""
    rows = [[x for a in r for x in ((Action(a.stage, I, a.microbatch), Action(a.stage, W, a.microbatch))
                                    if a.kind.value == "B" else (a,))] for r in table.compact().rows]
    return ScheduleTable(tuple(map(tuple, rows)), table.placement, table.n_microbatches, name)


def max_rel(got: dict, ref: dict) -> float:
    assert set(got) == set(ref)
    return max(float((got[n] - ref[n]).norm() / ref[n].norm()) for n in ref)


def run_and_replay(model, S, M, rule, split_backward):
    sched = async_schedule(rule, S, M)
    table = sched.table.compact()
    if split_backward:
        table = split(table, sched.table.name)
        sched = schedule_versions(table, rule, sched.window)
    part = uniform_partition(model.n_layers, S)
    job = tiny.job(model, part, table.compute_only(), dispatch="strict", timeout_s=240.0)
    got = execute(replace(job, weights=WeightStash(sched, LR)))
    ref = replay(model, part, sched, LR)
    losses = got.microbatch_losses[0]
    assert sorted(losses) == list(range(M))
    loss_err = max(abs(losses[k] - ref.losses[k]) / abs(ref.losses[k]) for k in range(M))
    return max(loss_err, max_rel(got.weights, ref.weights)), ref


@pytest.mark.parametrize("model, rule, split_backward", [
    (tiny.hybrid(), "pd", False), (tiny.vlm(), "pd", True),
    pytest.param(tiny.hybrid(), "2bw", True, marks=pytest.mark.slow),
    pytest.param(tiny.vlm(), "vsync", False, marks=pytest.mark.slow),
])
def test_asynchronous_runtime_equals_its_replay(model, rule, split_backward):
    torch.manual_seed(0)
    err, ref = run_and_replay(model, 2, 6, rule, split_backward)
    assert err < 1e-5
    # the updates happened: the final weights moved away from the initial ones
    init = replay(model, uniform_partition(model.n_layers, 2), async_schedule(rule, 2, 6), 1e-30).weights
    assert max_rel(ref.weights, init) > 1e-4
