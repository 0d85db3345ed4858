"""The strict engine in C (`octopipe/sim/strict.c`) against its Python twin, to the bit."""
from __future__ import annotations

import numpy as np
import pytest

from octopipe.schedule.library import SCHEDULES, build_schedule
from octopipe.schedule.table import ScheduleTable
from octopipe.sim.durations import uniform
from octopipe.sim.engine import SEMANTICS, run_strict, run_strict_py, strict_kernel
from octopipe.sim.program import compile_table

pytestmark = pytest.mark.skipif(strict_kernel() is None, reason="no C compiler: only the Python engine")


def _jittered(prog, rng):
    d = uniform(prog, 1.0, 2.0, 1.0, 0.3, 1.0)
    return d.scaled(compute=d.compute * rng.uniform(0.5, 1.5, d.compute.shape),
                    transfer=d.transfer * rng.uniform(0.0, 2.0, d.transfer.shape))


def _same(a, b) -> bool:
    if b.stuck is not None:
        return a.stuck is not None and a.stuck.pos == b.stuck.pos and a.stuck.arrived == b.stuck.arrived
    return (a.stuck is None and all(np.array_equal(x, y) for x, y in (
        (a.start, b.start), (a.end, b.end), (a.t_start, b.t_start), (a.t_end, b.t_end),
        (a.peak_act, b.peak_act), (a.mem_blocked, b.mem_blocked)))
        and len(a.order) == len(b.order) and all(np.array_equal(x, y) for x, y in zip(a.order, b.order)))


def test_every_named_schedule_under_every_semantics():
    """Every start, end, transfer, peak and device order equal, on jittered durations; where the
    Python engine stalls (rendezvous, batched), the C run stalls too and replays it."""
    rng = np.random.default_rng(5)
    stalled = ran = 0
    for name in SCHEDULES:
        for p, m in ((2, 4), (4, 8), (3, 5)):
            try:
                table = build_schedule(name, p, m)
            except Exception:
                continue
            prog = compile_table(table)
            for sem in SEMANTICS:
                dur = _jittered(prog, rng)
                a, b = run_strict(prog, dur, sem), run_strict_py(prog, dur, sem)
                assert _same(a, b), (name, p, m, sem)
                stalled += b.stuck is not None
                ran += 1
    assert ran > 60 and 0 < stalled < ran


def test_shuffled_rows_stall_or_agree():
    """Rows in random orders (most stall under some semantics): the same outcome either way."""
    rng = np.random.default_rng(9)
    base = build_schedule("1f1b", 4, 6)
    for _ in range(40):
        rows = [list(r) for r in base.rows]
        for r in rows:
            k = int(rng.integers(0, len(r) - 1))
            r[k], r[k + 1] = r[k + 1], r[k]
        prog = compile_table(ScheduleTable.from_rows(rows, base.placement, 6))
        for sem in SEMANTICS:
            dur = _jittered(prog, rng)
            assert _same(run_strict(prog, dur, sem), run_strict_py(prog, dur, sem))
