"""The layers' bytes as the runtime keeps them, the memory columns a plan is simulated with, and
the simulated peaks against a walk of each rank's row."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from octopipe.cluster import Link
from octopipe.config.cost import AnalyticCost
from octopipe.cost.analytic import analytic_costs
from octopipe.measure.memory import executed_bytes, executed_table, layer_bytes, measured_bytes, memory_costs
from octopipe.plan import Plan
from octopipe.runtime.compute import RealCompute
from octopipe.runtime.machine import local_cluster
from octopipe.schedule.action import ActionKind
from octopipe.schedule.library import build_schedule
from octopipe.sim import simulate
from tests.runtime.tiny import attn, emb, head, mamba1, mamba2, mlp, model

MODEL = model([emb(), mamba2(), attn(), mlp(), mamba1(), mlp(), head()])
PARTITION = ((0, 3), (3, 7))


@pytest.fixture(scope="module")
def measured():
    return layer_bytes(MODEL)


def _stage(stage: int) -> RealCompute:
    return RealCompute(MODEL, PARTITION, ((0, stage),), 1, 0, torch.device("cpu"))


def test_layer_bytes_add_up_to_what_each_stage_keeps(measured):
    """One micro-batch through a two-stage split, each stage alone: after F the meter holds the
    stage's layers' forward bytes (the second stage also its received input); after I, their
    after-input bytes (the first stage, without an input gradient, keeps nothing more)."""
    first, second = _stage(0), _stage(1)
    for c in (first, second):
        c.start_iteration(0)
    x = first.forward(0, 0, None)
    assert first.meter.live == measured.forward[:3].sum()
    received = x.clone()                        # a transfer: a storage of its own
    second.forward(1, 0, received)
    assert second.meter.live == measured.forward[3:].sum() + measured.output[2]
    grad = second.backward_input(1, 0, None)
    assert second.meter.live == measured.after_input[3:].sum() + measured.output[2]
    assert first.backward_input(0, 0, grad) is None and first.meter.live == measured.forward[:3].sum()
    second.backward_weight(1, 0)
    first.backward_weight(0, 0)
    assert first.meter.live == second.meter.live == 0
    assert (measured.after_input[1:] > measured.forward[1:]).all()     # I keeps gradients for W
    params = sum(p.numel() for p in first.parameters()) + sum(p.numel() for p in second.parameters())
    assert measured.state.sum() == 2 * 4 * params and measured.output[2] == 4 * 2 * 16 * 32


def _row_peaks(table, costs, partition) -> list[float]:
    """Each device's static bytes plus the most its row holds, walked in row order: F adds what F
    keeps, I what it adds on top, W frees the micro-batch's bytes after I, B those after F."""
    act = [costs.act_bytes[lo:hi].sum() for lo, hi in partition]
    wact = [costs.w_act_bytes[lo:hi].sum() for lo, hi in partition]
    peaks = []
    for d, row in enumerate(table.rows):
        live = best = 0.0
        for a in (a for a in row if a is not None):
            delta = {ActionKind.F: act[a.stage], ActionKind.I: wact[a.stage] - act[a.stage],
                     ActionKind.W: -wact[a.stage], ActionKind.B: -act[a.stage]}[a.kind]
            live += delta
            best = max(best, live)
        static = sum(costs.static_bytes[lo:hi].sum() for s, (lo, hi) in enumerate(partition)
                     if table.placement[s] == d)
        peaks.append(static + best)
    return peaks


@pytest.mark.parametrize("name", ["1f1b", "zbh1", "gpipe"])
def test_memory_costs_give_the_simulator_each_rows_peak(measured, name):
    """Strict dispatch follows each row, so the simulator's peak is what walking the row holds at
    most, the bytes an I adds included."""
    cluster = local_cluster(2, Link("loop", 1e9, 1e-5))
    table = build_schedule(name, 2, 4).compute_only()
    costs = memory_costs(analytic_costs(AnalyticCost(), MODEL, cluster), measured, table, PARTITION)
    split = name == "zbh1"
    assert np.array_equal(costs.static_bytes, measured.state)
    assert costs.act_bytes[3] == measured.forward[3] + measured.output[2]          # the input received
    assert np.array_equal(costs.w_act_bytes[:3], measured.forward[:3] if split else np.zeros(3))
    if split:
        assert np.array_equal(costs.w_act_bytes[4:], measured.after_input[4:])
        assert costs.w_act_bytes[3] == measured.after_input[3] + measured.output[2]
    res = simulate(Plan(PARTITION, table), costs, cluster, policy="strict", semantics="eager")
    assert list(res.peak_memory) == pytest.approx(_row_peaks(table, costs, PARTITION), rel=1e-12)


def test_measured_bytes_are_each_ranks_median_over_the_measured_iterations():
    events = [[{"it": it, "saved_peak_bytes": p, "state_bytes": 10} for it, p in enumerate((500, 30, 50, 40))]
              + [{"it": 1, "action": "0F0"}],
              [{"it": it, "saved_peak_bytes": 7, "state_bytes": 3} for it in range(4)]]
    assert measured_bytes(events, [1, 2, 3]) == [50.0, 10.0]


def _events(rows, it: int) -> list[list[dict]]:
    """Action records of iteration `it` in each row's given order (what a worker writes)."""
    return [[{"it": it, "action": str(a), "start": float(k), "end": k + 0.5} for k, a in enumerate(row)]
            for row in rows]


def test_executed_bytes_are_the_peak_of_the_order_the_ranks_ran(measured):
    """Ready-first may run a row's forwards before its backward: the peak of the order recorded
    (rank 0 ran all four forwards first, as GPipe) is that order's row walk, not the table's."""
    cluster = local_cluster(2, Link("loop", 1e9, 1e-5))
    table = build_schedule("1f1b", 2, 4).compute_only()
    costs = memory_costs(analytic_costs(AnalyticCost(), MODEL, cluster), measured, table, PARTITION)
    row0 = [a for a in table.rows[0] if a is not None]
    ran = [sorted(row0, key=lambda a: (a.kind is not ActionKind.F, a.microbatch)),
           [a for a in table.rows[1] if a is not None]]
    events = _events(ran, 3)
    assert executed_table(table, events, 3).rows == tuple(tuple(r) for r in ran)
    got = executed_bytes(Plan(PARTITION, table), costs, cluster, events, [3])
    want = _row_peaks(table, costs, PARTITION)
    assert got[1] == pytest.approx(want[1], rel=1e-12)
    assert got[0] > want[0]
    assert got == pytest.approx(_row_peaks(executed_table(table, events, 3), costs, PARTITION), rel=1e-12)
    assert executed_bytes(Plan(PARTITION, table), costs, cluster, [events[0][:-1], events[1]], [3]) is None
