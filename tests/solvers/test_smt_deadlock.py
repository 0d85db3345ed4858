"""SMT deadlock check against the simulator's deadlock detection and hand-made deadlocks."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import networkx as nx
import numpy as np
import pytest
import z3

from octopipe.errors import ConfigError
from octopipe.schedule.library import build_schedule
from octopipe.schedule.lower import lower
from octopipe.schedule.table import ScheduleTable
from octopipe.sim.simulator import find_deadlock
from solvers.smt import SEMANTICS, check_deadlock_free
from solvers.smt.deadlock import _solver, acyclic, cyclic_core
from tests.solvers.random_tables import random_table

# Device 0 posts the gradient's receive before sending the activation device 1 needs:
# irecv (eager) and a posted group (batched) let it through, a blocking receive does not.
CROSSED = [["0F0", "0RECV_B0", "0SEND_F0", "0B0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]]
# Device 0 runs the backward before sending the forward output: stuck under every semantics.
SEND_AFTER = [["0F0", "0RECV_B0", "0B0", "0SEND_F0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]]
# Device 0 waits for gradient 0 before sending micro-batch 1, which device 1 needs first.
WAIT_EARLY = [["0F0", "0SEND_F0", "0RECV_B0", "0F1", "0SEND_F1", "0RECV_B1", "0B0", "0B1"],
              ["1RECV_F0", "1F0", "1RECV_F1", "1F1", "1B0", "1SEND_B0", "1B1", "1SEND_B1"]]


@pytest.mark.parametrize("rows,n_mb,expected", [
    (CROSSED, 1, {"eager": True, "rendezvous": False, "batched": True}),
    (SEND_AFTER, 1, {"eager": False, "rendezvous": False, "batched": False}),
    (WAIT_EARLY, 2, {"eager": True, "rendezvous": False, "batched": False}),
])
def test_hand_made_tables_per_semantics(rows, n_mb, expected):
    t = ScheduleTable.from_strings(rows, (0, 1), n_mb)
    for sem in SEMANTICS:
        verdict = check_deadlock_free(t, sem)
        assert verdict.ok == expected[sem], sem
        assert verdict.ok == (find_deadlock(t, sem) is None), sem
        if not verdict.ok:
            assert verdict.cycle and verdict.grid


def test_counterexample_names_the_cycle_and_marks_the_grid():
    t = ScheduleTable.from_strings([["0F0", "0RECV_B0", "0SEND_F0", "0B0"],
                                    ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]], (0, 1), 1)
    v = check_deadlock_free(t, "rendezvous")
    assert not v.ok
    text = v.report()
    assert "0RECV_B0" in text and "1RECV_F0" in text and "device 0" in text and "device 1" in text
    assert ">" in v.grid and "<" in v.grid and "dev   1" in v.grid
    assert {d for d, *_ in v.cycle} == {0, 1}


@pytest.mark.parametrize("name", ["1f1b", "interleaved", "zbv", "gpipe"])
def test_named_schedules_are_deadlock_free_when_lowered(name):
    t = lower(build_schedule(name, 4, 8))
    assert check_deadlock_free(t, "eager").ok


def test_unknown_semantics_is_rejected():
    with pytest.raises(ConfigError, match="semantics"):
        check_deadlock_free(lower(build_schedule("1f1b", 2, 2)), "lazy")


@pytest.mark.parametrize("chunk", range(6))
def test_smt_agrees_with_simulator_on_random_tables(chunk):
    """240 random tables (valid random orders, lowered, then random SEND/RECV moves) x 3
    semantics: the z3 verdict equals the simulator's `find_deadlock` on every one."""
    rng = np.random.default_rng(100 + chunk)
    seen = {True: 0, False: 0}
    for _ in range(40):
        t = random_table(rng)
        for sem in SEMANTICS:
            smt = check_deadlock_free(t, sem, explain=False).ok
            sim = find_deadlock(t, sem) is None
            assert smt == sim, (sem, t.as_strings())
            seen[smt] += 1
    assert seen[True] > 10 and seen[False] > 10     # both outcomes are exercised


def test_eight_devices_sixty_four_microbatches_with_a_deadlock():
    table = lower(build_schedule("1f1b", 8, 64))
    rows = [list(table.actions(d)) for d in range(8)]
    k = next(i for i, a in enumerate(rows[4]) if a.kind.name == "RECV_B")
    rows[4].insert(3, rows[4].pop(k))          # device 4 waits for a gradient far too early
    bad = table.with_rows(rows)
    assert check_deadlock_free(table, "rendezvous").ok
    v = check_deadlock_free(bad, "rendezvous")
    assert not v.ok and find_deadlock(bad, "rendezvous") is not None
    assert 4 in {d for d, *_ in v.cycle}


LARGE_CHECK = """
from octopipe.schedule.library import build_schedule
from octopipe.sim.simulator import find_deadlock
from solvers.smt import check_deadlock_free
table = build_schedule("zbh1", 8, 128, 6)
print(sum(1 for _ in table))
for sem in ("eager", "rendezvous"):
    v = check_deadlock_free(table, sem)
    print(sem, v.ok, find_deadlock(table, sem) is None, bool(v.cycle))
"""


@pytest.mark.slow
def test_large_table_is_checked_without_crashing_the_process():
    """18,432 actions (8 devices, 128 micro-batches, 48 stages; 140,000 events): z3 once
    segfaulted here. A subprocess, so that a crash fails this test instead of killing pytest."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", LARGE_CHECK], cwd=root, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.split("\n")
    assert int(lines[0]) >= 18_000
    assert lines[1:3] == ["eager True True False", "rendezvous False False True"]


def test_acyclic_agrees_with_networkx_on_random_graphs():
    """The fast path of `cyclic_core` (Kahn's sort) against networkx's cycle test."""
    rng = np.random.default_rng(0)
    verdicts = set()
    for trial in range(300):
        n = int(rng.integers(1, 30))
        edges = [(int(rng.integers(n)), int(rng.integers(n)), "x") for _ in range(int(rng.integers(0, 2 * n + 1)))]
        if trial % 2:                  # half the graphs point forward only: acyclic
            edges = [(min(a, b), max(a, b), w) for a, b, w in edges if a != b]
        graph = nx.DiGraph()
        graph.add_nodes_from(range(n))
        graph.add_edges_from((a, b) for a, b, _ in edges)
        expected = nx.is_directed_acyclic_graph(graph)
        assert acyclic(n, edges) == expected, edges
        assert (cyclic_core(SimpleNamespace(n_events=n, edges=edges)) == []) == expected
        verdicts.add(expected)
    assert verdicts == {True, False}


def test_each_check_gets_a_z3_context_of_its_own():
    """z3's shared main context keeps the partial order's state across solvers, so checks in one
    process slowed down one after another; each solver now has its own context."""
    a, b = _solver(), _solver()
    assert a.ctx != b.ctx and z3.main_ctx() not in (a.ctx, b.ctx)
