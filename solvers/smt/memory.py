"""SMT check (z3): is there a deadlock-free execution in which every device stays within memory?

Memory of a device at any moment (the simulator's accounting plus messages in flight):

- static bytes of every stage it holds (parameters, gradients, optimizer state);
- activations: F allocates its stage's `act_bytes` when it starts; I frees all but `w_act_bytes`
  when it ends, W frees the rest, B frees everything;
- messages: a transfer's bytes sit on the sender from the moment its SEND is reached until the
  transfer arrives, then on the receiver until the consuming compute starts.

Executions are the orders of events allowed by `solvers.smt.events` where devices may hold an
action back (a device can idle) and durations are arbitrary: z3 chooses an integer time per
event with `time[y] >= time[x] + 1` on every wait edge (events no wait orders may coincide; a
z3 LinearOrder encoding was measured 3x slower here), and memory is
checked at every event that can raise it (an F starting, a SEND reached, a message arriving).
Whether an event precedes a checkpoint is decided statically when the wait graph already orders
them (ancestor bitsets) and left to z3 otherwise; so on tables whose rows fix everything the
check is exact arithmetic, and where timing matters (which device holds a message) z3 searches.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np
import z3

from octopipe.cluster import Cluster
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.schedule.action import B, F, I, W
from octopipe.schedule.table import ScheduleTable
from solvers.smt.deadlock import check_deadlock_free
from solvers.smt.events import EventGraph, build_event_graph
from solvers.smt.verdict import SmtVerdict

GIB = float(2 ** 30)


@dataclass(frozen=True)
class MemoryModel:
    """Per compute action: bytes allocated at start and freed at end; per transfer: bytes;
    per device: static bytes and capacity."""

    alloc: dict
    free: dict
    transfer_bytes: list
    static: np.ndarray
    capacity: np.ndarray


def memory_model(g: EventGraph, costs: CostTable, partition: Sequence[tuple[int, int]],
                 cluster: Cluster | None, capacity: Sequence[float] | None) -> MemoryModel:
    table = g.table
    if len(partition) != table.n_stages:
        raise ConfigError(f"partition has {len(partition)} stages, the table has {table.n_stages}")
    act = [costs.range_sum("act_bytes", lo, hi) for lo, hi in partition]
    wact = [costs.range_sum("w_act_bytes", lo, hi) for lo, hi in partition]
    stat = [costs.range_sum("static_bytes", lo, hi) for lo, hi in partition]
    out = [float(costs.out_bytes[hi - 1]) for _, hi in partition]
    alloc, free = {}, {}
    for unit in g.units:
        for _, a in unit.cells:
            s = a.stage
            if a.kind is F:
                alloc[a], free[a] = act[s], 0.0
            elif a.kind is I:
                alloc[a], free[a] = 0.0, act[s] - wact[s]
            elif a.kind is W:
                alloc[a], free[a] = 0.0, wact[s]
            elif a.kind is B:
                alloc[a], free[a] = 0.0, act[s]
    tbytes = [out[t.producer.stage] if t.forward else out[t.producer.stage - 1] for t in g.transfers]
    static = np.zeros(table.n_devices)
    for pl in table.all_placements():
        for s, d in enumerate(pl):
            static[d] += stat[s]
    if capacity is None:
        if cluster is None:
            raise ConfigError("check_memory_feasible needs a cluster or explicit capacities")
        capacity = [cluster.kind_of(d).memory_bytes for d in range(table.n_devices)]
    cap = np.asarray(capacity, dtype=float)
    if cap.shape != (table.n_devices,):
        raise ConfigError(f"capacity has {cap.size} entries for {table.n_devices} devices")
    return MemoryModel(alloc, free, tbytes, static, cap)


def _b(x: float) -> int:
    """Bytes as an exact integer (z3 would round a float constant to a decimal)."""
    return int(round(float(x)))


def _ancestors(g: EventGraph) -> list[int]:
    """anc[e]: bitset of events that happen before e in every execution (acyclic graph)."""
    preds: list[list[int]] = [[] for _ in range(g.n_events)]
    dg = nx.DiGraph()
    dg.add_nodes_from(range(g.n_events))
    for a, b, _ in g.edges:
        preds[b].append(a)
        dg.add_edge(a, b)
    anc = [0] * g.n_events
    for e in nx.topological_sort(dg):
        m = 0
        for p in preds[e]:
            m |= anc[p] | (1 << p)
        anc[e] = m
    return anc


def _memory_events(g, mm, n_devices: int) -> tuple[dict[int, list], list[tuple[int, int]], dict[int, list]]:
    """Per device, the events that allocate (+bytes) or free (-bytes) memory; the checkpoints
    (device, event) where a peak can occur; per device, the messages it holds (on, off, bytes)."""
    per_device: dict[int, list] = {d: [] for d in range(n_devices)}   # (event, amount, coeff)
    for u, unit in enumerate(g.units):
        for _, a in unit.cells:
            if a.kind.is_compute:
                per_device[unit.device].append((g.start(u), mm.alloc[a]))
                per_device[unit.device].append((g.passed(u), -mm.free[a]))
    checkpoints: list[tuple[int, int]] = []                      # (device, event)
    for u, unit in enumerate(g.units):
        for _, a in unit.cells:
            if a.kind is F:
                checkpoints.append((unit.device, g.start(u)))
    flows = []                                                    # (device, on, off, bytes)
    for i, t in enumerate(g.transfers):
        send_u = g.unit_of[t.send]
        cons_u = g.unit_of[t.consumer]
        nb = mm.transfer_bytes[i]
        flows.append((t.src, g.reach(send_u), g.arrive(i), nb))
        flows.append((t.dst, g.arrive(i), g.start(cons_u), nb))
        if nb > 0:
            checkpoints.append((t.src, g.reach(send_u)))
            checkpoints.append((t.dst, g.arrive(i)))
    flows_of: dict[int, list] = {d: [] for d in range(n_devices)}
    for d, on, off, nb in flows:
        if nb > 0:
            flows_of[d].append((on, off, nb))
    return per_device, checkpoints, flows_of


def check_memory_feasible(table: ScheduleTable, costs: CostTable,
                          partition: Sequence[tuple[int, int]], cluster: Cluster | None = None,
                          semantics: str = "eager", capacity: Sequence[float] | None = None
                          ) -> SmtVerdict:
    """Decide whether some deadlock-free execution of `table` keeps every device within memory.

    `partition[s] = (lo, hi)` gives stage s its layers (and so its bytes); capacities come from
    the cluster's device kinds unless `capacity` (bytes per device) is given.
    """
    t0 = time.perf_counter()
    dl = check_deadlock_free(table, semantics)
    if not dl.ok:
        return SmtVerdict(False, "memory-feasible", semantics, time.perf_counter() - t0,
                          dl.n_events, dl.n_constraints,
                          "no execution runs to the end, so none fits in memory:\n" + dl.explanation,
                          dl.grid, dl.cycle)
    g = build_event_graph(table, semantics)
    mm = memory_model(g, costs, partition, cluster, capacity)
    anc = _ancestors(g)
    s = z3.Solver(ctx=z3.Context())     # a context of its own, as the deadlock check's
    s.from_string("\n".join([f"(declare-const t{i} Int)" for i in range(g.n_events)]
                            + [f"(assert (>= t{b} (+ t{a} 1)))" for a, b, _ in g.edges]))
    ev = [z3.Int(f"t{i}", s.ctx) for i in range(g.n_events)]

    def happened(x: int, k: int):
        """1/0 when the wait graph decides whether event x is at or before checkpoint k."""
        if x == k or (anc[k] >> x) & 1:
            return 1
        if (anc[x] >> k) & 1:
            return 0
        return ev[x] <= ev[k]

    per_device, checkpoints, flows_of = _memory_events(g, mm, table.n_devices)

    lits = {}
    exprs = {}
    for d, k in checkpoints:
        const = mm.static[d]
        terms = []
        for x, amount in per_device[d]:
            if amount == 0:
                continue
            h = happened(x, k)
            if isinstance(h, int):
                const += amount * h
            else:
                terms.append(z3.If(h, z3.IntVal(_b(amount), s.ctx), 0))
        for on, off, nb in flows_of[d]:
            h_on, h_off = happened(on, k), happened(off, k)
            if isinstance(h_on, int) and isinstance(h_off, int):
                const += nb * (h_on and not h_off)
            elif not (isinstance(h_on, int) and h_on == 0) and not (isinstance(h_off, int) and h_off == 1):
                parts = ([] if isinstance(h_on, int) else [h_on]) + ([] if isinstance(h_off, int) else [z3.Not(h_off)])
                terms.append(z3.If(z3.And(*parts), z3.IntVal(_b(nb), s.ctx), 0))
        total = z3.Sum(terms) + _b(const) if terms else z3.IntVal(_b(const), s.ctx)
        exprs[(d, k)] = (total, const, len(terms))
        lit = z3.Bool(f"mem_{d}_{k}", s.ctx)
        lits[lit.get_id()] = (d, k, lit)
        s.add(z3.Implies(lit, total <= int(np.floor(mm.capacity[d]))))
    assumptions = [v[2] for v in lits.values()]
    result = s.check(*assumptions)
    dt = time.perf_counter() - t0
    n_cons = len(g.edges) + len(checkpoints)
    if result == z3.sat:
        model = s.model()
        peak = np.array(mm.static, dtype=float)
        for (d, _), (expr, _, _) in exprs.items():
            val = model.eval(expr, model_completion=True)
            peak[d] = max(peak[d], float(val.as_long()))
        return SmtVerdict(True, "memory-feasible", semantics, dt, g.n_events, n_cons,
                          witness={"peak_memory_bytes": peak.tolist(),
                                   "capacity_bytes": mm.capacity.tolist()})
    core = s.unsat_core()
    culprits = sorted((lits[c.get_id()][:2] for c in core if c.get_id() in lits),
                      key=lambda dk: (g.units[g.owner(dk[1])[1]].column if g.owner(dk[1])[0] == "unit"
                                      else 0, dk[0]))
    d, k = culprits[0] if culprits else checkpoints[0]
    _, const, _ = exprs[(d, k)]
    kind, i = g.owner(k)
    unit = i if kind == "unit" else g.unit_of[g.transfers[i].consumer]
    over = const - mm.capacity[d]
    lines = [f"no execution keeps every device within memory under {semantics} semantics:",
             f"  device {d} at {g.describe_event(k)} holds at least {const / GIB:.2f} GiB "
             f"(static {mm.static[d] / GIB:.2f} GiB) against {mm.capacity[d] / GIB:.2f} GiB"
             + (f", {over / GIB:.2f} GiB ({over:.3e} bytes) over" if over > 0 else
                " once the messages it must hold are counted")]
    others = [c for c in culprits if c != (d, k)]
    if others:
        lines.append("  together with " + ", ".join(f"device {dd} at {g.describe_event(kk)}"
                                                    for dd, kk in others[:6]))
    lines.append("  fewer micro-batches in flight, activation recomputation or more devices help")
    return SmtVerdict(False, "memory-feasible", semantics, dt, g.n_events, n_cons,
                      "\n".join(lines), g.grid(unit))
