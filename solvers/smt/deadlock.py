"""SMT check (z3): does a fixed-order table run to the end under a communication semantics?

Each event of `solvers.smt.events` is a constant of an uninterpreted sort ordered by a z3
partial order `before` (a special relation, decided by graph reasoning); each wait edge (x, y)
asserts `before(x, y)` and `x != y`. The constraints are satisfiable iff an execution that
passes every cell exists: every wait is a conjunction, so the only obstacle is a cycle of waits,
which antisymmetry collapses into a contradiction. (Integer times with `t[y] >= t[x] + 1` say
the same but z3's arithmetic needs 30 s instead of 0.4 s on an 8-device, 64-micro-batch 1F1B
table.)

Up to `FULL_SMT_MAX_EVENTS` events, z3 decides the whole formula, and its verdict must agree
with the exact reduction below (a disagreement raises: two independent deciders). Above that
size only the reduction runs the whole graph. The reduction: a cycle of waits lies inside one strongly connected
component
of the wait graph, and the waits between components can always be met (order the components
topologically). So the constraints are satisfiable iff no component holds an edge of its own,
and unsatisfiable as soon as one component's own edges are. With no such component the table
is deadlock-free (a topological order of the events is an execution); otherwise z3 is given the
smallest one, proves its waits infeasible and, with one tracking literal per unit and transfer,
names a cycle of waits through its minimized unsat core, which we order and print on the grid.

Why not the whole formula: on a 48-stage, 128-micro-batch, 8-device zbh1 table (18,432 actions,
140,000 events) z3 needed 49 s under rendezvous semantics (one component of about 190,000
edges; the smallest has 4), and z3 5.4's model construction for a large partial order
(`theory_special_relations::init_model_po` → `recfun` definitions) segfaults the process at
about 60,000 events whatever the stack size. No query asks z3 for a model.
"""
from __future__ import annotations

import time

import networkx as nx
import z3

from octopipe.schedule.table import ScheduleTable
from octopipe.schedule.validate import kahn
from solvers.smt.events import RUNS, Edge, EventGraph, build_event_graph
from solvers.smt.verdict import SmtVerdict


def smt_text(g: EventGraph, tracked: bool = False,
             edges: list[Edge] | None = None) -> str:
    """The constraints of `edges` (all of `g`'s by default) as SMT-LIB: one constant per event,
    `before` = z3's partial order.

    Text keeps z3's C++ parser on the hot path (building 10^4 terms through the Python API takes
    seconds). With `tracked`, each unit's and transfer's incoming waits hang off a literal
    named after it (`unit12`, `transfer3`) so that an unsat core names them.
    """
    edges = g.edges if edges is None else edges
    lines = ["(declare-sort Event 0)"]
    events = sorted({x for a, b, _ in edges for x in (a, b)})
    lines += [f"(declare-const e{i} Event)" for i in events]
    owners: set[tuple[str, int]] = set()
    for a, b, _ in edges:
        fact = f"(and ((_ partial-order 0) e{a} e{b}) (not (= e{a} e{b})))"
        if tracked:
            kind, i = g.owner(b)
            if (kind, i) not in owners:
                owners.add((kind, i))
                lines.append(f"(declare-const {kind}{i} Bool)")
            fact = f"(=> {kind}{i} {fact})"
        lines.append(f"(assert {fact})")
    return "\n".join(lines)


def acyclic(n_events: int, edges: list[Edge]) -> bool:
    """Whether the wait graph has no cycle: Kahn's sort over flat lists (a deadlock-free table,
    the common case, needs no component search)."""
    succ: list[list[int]] = [[] for _ in range(n_events)]
    indegree = [0] * n_events
    for a, b, _ in edges:
        succ[a].append(b)
        indegree[b] += 1
    return kahn(succ, indegree, range(n_events)) == n_events


def cyclic_core(g: EventGraph) -> list[list[Edge]]:
    """The wait edges inside each strongly connected component that has any (self-loops
    included): the only edges a cycle of waits can use."""
    if acyclic(g.n_events, g.edges):
        return []
    graph = nx.DiGraph()
    graph.add_nodes_from(range(g.n_events))
    graph.add_edges_from((a, b) for a, b, _ in g.edges)
    comp = {}
    for k, nodes in enumerate(nx.strongly_connected_components(graph)):
        for x in nodes:
            comp[x] = k
    cores: dict[int, list[Edge]] = {}
    for e in g.edges:
        if comp[e[0]] == comp[e[1]]:
            cores.setdefault(comp[e[0]], []).append(e)
    return list(cores.values())


FULL_SMT_MAX_EVENTS = 40_000


def _solver() -> z3.Solver:
    """A solver in a context of its own that answers sat/unsat without building a model (see the
    module docstring). In z3's shared main context the partial order's state outlives the solver:
    each check of one table took longer than the last (0.64 s, then 0.89 s by the sixth)."""
    s = z3.Solver(ctx=z3.Context())
    s.set("model", False)
    return s


def check_deadlock_free(table: ScheduleTable, semantics: str = "eager",
                        explain: bool = True,
                        full_smt_max_events: int = FULL_SMT_MAX_EVENTS) -> SmtVerdict:
    """Decide whether `table` (lowered or compute-only) can run without deadlock: z3 on the
    whole formula (up to `full_smt_max_events`) checked against the exact cycle search on the
    wait graph, then z3 proof and explanation of a deadlock's cyclic component."""
    t0 = time.perf_counter()
    g = build_event_graph(table, semantics)
    cores = cyclic_core(g)
    if g.n_events <= full_smt_max_events:
        s = _solver()
        s.from_string(smt_text(g))
        answer = s.check()
        if answer != z3.unknown and (answer == z3.sat) != (not cores):
            raise AssertionError(f"z3 says {answer} on the whole formula but the cycle search "
                                 f"finds {len(cores)} cyclic component(s)")
    if not cores:
        return SmtVerdict(True, "deadlock-free", semantics, time.perf_counter() - t0,
                          g.n_events, len(g.edges))
    core = min(cores, key=len)
    if not explain:
        s = _solver()
        s.from_string(smt_text(g, edges=core))
        if s.check() != z3.unsat:
            raise AssertionError(f"z3 finds a cycle of waits satisfiable: {core}")
        return SmtVerdict(False, "deadlock-free", semantics, time.perf_counter() - t0,
                          g.n_events, len(g.edges))
    cycle, text, grid = counterexample(g, core)
    return SmtVerdict(False, "deadlock-free", semantics, time.perf_counter() - t0, g.n_events,
                      len(g.edges), text, grid, cycle)


def unsat_core_owners(g: EventGraph, edges: list[Edge] | None = None
                      ) -> set[tuple[str, int]]:
    """Units/transfers whose incoming waits (among `edges`, all by default) form an
    unsatisfiable (cyclic) subset, via z3."""
    edges = g.edges if edges is None else edges
    s = _solver()
    s.set("core.minimize", True)
    s.from_string(smt_text(g, tracked=True, edges=edges))
    keys = sorted({g.owner(b) for _, b, _ in edges})
    lits = {f"{k}{i}": (k, i) for k, i in keys}
    if s.check(*[z3.Bool(name, s.ctx) for name in lits]) != z3.unsat:
        return set()
    return {lits[str(x)] for x in s.unsat_core() if str(x) in lits}


def counterexample(g: EventGraph, edges: list[Edge] | None = None
                   ) -> tuple[tuple, str, str]:
    """(cycle steps, text, marked grid) of a cycle of waits among `edges` (all of `g`'s by
    default, e.g. one strongly connected component) found through the unsat core."""
    owners = unsat_core_owners(g, edges)
    sub = nx.DiGraph()
    for a, b, why in g.edges if edges is None else edges:
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
        if why == RUNS:
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
