"""SMT check (z3): does a fixed-order table run to the end under a communication semantics?

Each event of `solvers.smt.events` is a constant of an uninterpreted sort ordered by a z3
partial order `before` (a special relation, decided by graph reasoning); each wait edge (x, y)
asserts `before(x, y)` and `x != y`. The constraints are satisfiable iff an execution that
passes every cell exists (every wait is a conjunction, so the only obstacle is a cycle of waits,
which antisymmetry collapses into a contradiction); any linear extension of the model's order is
such an execution. (Integer times with `t[y] >= t[x] + 1` say the same but z3's arithmetic
needs 30 s instead of 0.4 s on an 8-device, 64-micro-batch 1F1B table.) When it is
unsatisfiable, the edges are re-asserted under one tracking literal per unit and transfer; z3's
minimized unsat core names the units and transfers of a cycle of waits, which we then order and
print on the table grid.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import networkx as nx
import z3

from octopipe.schedule.table import ScheduleTable
from solvers.smt.events import EventGraph, build_event_graph
from solvers.smt.verdict import SmtVerdict


@dataclass(frozen=True)
class Order:
    """The z3 encoding of the events: constants of a sort and the partial order `before`."""

    events: list
    before: z3.FuncDeclRef

    @classmethod
    def new(cls, n_events: int) -> "Order":
        sort = z3.DeclareSort("Event")
        return cls([z3.Const(f"e{i}", sort) for i in range(n_events)], z3.PartialOrder(sort, 0))

    def edge(self, a: int, b: int) -> z3.BoolRef:
        return z3.And(self.before(self.events[a], self.events[b]), self.events[a] != self.events[b])


def _track_key(g: EventGraph, event: int) -> tuple[str, int]:
    return g.owner(event)


def check_deadlock_free(table: ScheduleTable, semantics: str = "eager",
                        explain: bool = True) -> SmtVerdict:
    """Decide with z3 whether `table` (lowered or compute-only) can run without deadlock."""
    t0 = time.perf_counter()
    g = build_event_graph(table, semantics)
    times = Order.new(g.n_events)
    s = z3.Solver()
    s.add([times.edge(a, b) for a, b, _ in g.edges])
    result = s.check()
    dt = time.perf_counter() - t0
    if result == z3.sat:
        return SmtVerdict(True, "deadlock-free", semantics, dt, g.n_events, len(g.edges))
    if not explain:
        return SmtVerdict(False, "deadlock-free", semantics, dt, g.n_events, len(g.edges))
    cycle, text, grid = counterexample(g, times)
    return SmtVerdict(False, "deadlock-free", semantics, time.perf_counter() - t0, g.n_events,
                      len(g.edges), text, grid, cycle)


def unsat_core_owners(g: EventGraph, times: Order) -> set[tuple[str, int]]:
    """Units/transfers whose incoming waits form an unsatisfiable (cyclic) subset, via z3."""
    s = z3.Solver()
    s.set("core.minimize", True)
    lits: dict[tuple[str, int], z3.BoolRef] = {}
    for a, b, _ in g.edges:
        key = _track_key(g, b)
        lit = lits.get(key)
        if lit is None:
            lit = lits[key] = z3.Bool(f"{key[0]}{key[1]}")
        s.add(z3.Implies(lit, times.edge(a, b)))
    if s.check(*lits.values()) != z3.unsat:
        return set()
    core = {str(x) for x in s.unsat_core()}
    return {k for k, v in lits.items() if str(v) in core}


def counterexample(g: EventGraph, times: Order) -> tuple[tuple, str, str]:
    """(cycle steps, text, marked grid) of a cycle of waits found through the unsat core."""
    owners = unsat_core_owners(g, times)
    sub = nx.DiGraph()
    for a, b, why in g.edges:
        if g.owner(b) in owners:
            sub.add_edge(a, b, why=why)
    try:
        cyc = nx.find_cycle(sub)
    except nx.NetworkXNoCycle:
        full = nx.DiGraph((a, b, {"why": w}) for a, b, w in g.edges)
        cyc = nx.find_cycle(full)
        sub = full
    steps = []
    first_unit = None
    for a, b, *_ in cyc:
        kind, i = g.owner(b)
        why = sub.edges[a, b]["why"]
        if why == "runs":
            continue
        if kind == "transfer":
            t = g.transfers[i]
            su = g.units[g.unit_of[t.send]]
            steps.append((t.src, su.column, f"transfer {t}", why))
            continue
        unit = g.units[i]
        if first_unit is None:
            first_unit = i
        steps.append((unit.device, unit.column, str(unit), why))
    devices = sorted({d for d, *_ in steps})
    lines = [f"deadlock under {g.semantics} semantics: devices {devices} wait on one another:"]
    for d, c, cell, why in steps:
        lines.append(f"  device {d}, column {c}: {cell} {why}")
    return tuple(steps), "\n".join(lines), g.grid(first_unit)
