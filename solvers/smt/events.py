"""The event graph of a fixed-order table under a communication semantics.

Every row of the table is a sequence of *units*: a compute cell, a SEND or RECV cell, or (batched
semantics) a maximal run of consecutive SEND/RECV cells, which NCCL posts as one group. Each unit
u has three events, `reach(u)` (the device arrives at it), `start(u)` (a compute begins; for
comm units it just follows reach) and `pass(u)` (it ends and the device moves on); each transfer
t has `arrive(t)`. A compute-only table gets its cells implicitly, as in the simulator
(`octopipe.sim.deadlock` states the same semantics): a RECV right before each compute that consumes data from another
device, a SEND right after each
compute that feeds one.

An edge (x, y) says y happens strictly after x:

- rows: reach(u) -> start(u) -> pass(u); pass(u) -> reach(next unit on the device);
- compute c: start(c) after pass of every same-device data predecessor (it must have ended),
  after pass of the RECV of the transfer c consumes, and after that transfer's arrival;
- transfer t: arrive(t) after pass(producer) and reach(SEND unit); under rendezvous and batched
  also after reach(RECV unit) (the receive must be posted);
- eager (isend/irecv): SEND and RECV pass at once; only the consuming compute waits for data;
- rendezvous: SEND passes after reach(RECV unit); RECV passes after arrive(t);
- batched: a group passes after arrive(t) of every transfer it sends or receives.

Every wait is a conjunction, so an execution that passes every cell exists iff this graph has no
cycle (`solvers.smt.deadlock` finds its cyclic components and has z3 prove one infeasible).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from octopipe.errors import ConfigError, ScheduleError
from octopipe.schedule.action import RECV_B, RECV_F, SEND_B, SEND_F, Action, B, F, I
from octopipe.schedule.table import ScheduleTable
from octopipe.schedule.text_grid import format_grid
from octopipe.schedule.validate import data_predecessors

SEMANTICS = ("eager", "rendezvous", "batched")
RUNS = "runs"     # the reason of a unit's own edges: reach -> start -> pass


class Why(NamedTuple):
    """Why an edge waits: a format string and its arguments, made text only when a deadlock is
    explained (formatting every edge's reason cost as much as the rest of the graph)."""

    template: str
    args: tuple

    def __str__(self) -> str:
        return self.template.format(*self.args)


Edge = tuple[int, int, "str | Why"]     # (before, after, why)


@dataclass(frozen=True)
class Transfer:
    """One message: `producer` on `src` feeds `consumer` on `dst`."""

    producer: Action
    consumer: Action
    src: int
    dst: int
    forward: bool

    @property
    def send(self) -> Action:
        s, m = self.producer.stage, self.producer.microbatch
        return Action(s, SEND_F if self.forward else SEND_B, m)

    @property
    def recv(self) -> Action:
        s, m = self.consumer.stage, self.consumer.microbatch
        return Action(s, RECV_F if self.forward else RECV_B, m)

    def __str__(self) -> str:
        return f"{self.send}->{self.recv} (device {self.src} -> {self.dst})"


@dataclass(frozen=True)
class Unit:
    """A compute cell, a comm cell or a batched group: `cells` are (column, action) pairs."""

    device: int
    cells: tuple[tuple[int, Action], ...]

    @property
    def column(self) -> int:
        return self.cells[0][0]

    @property
    def is_compute(self) -> bool:
        return self.cells[0][1].kind.is_compute

    def __str__(self) -> str:
        return "+".join(str(a) for _, a in self.cells)


@dataclass
class EventGraph:
    """Events are ints: reach(u) = 3u, start(u) = 3u + 1, pass(u) = 3u + 2, arrive(t) =
    3·n_units + t."""

    table: ScheduleTable
    semantics: str
    units: list[Unit]
    transfers: list[Transfer]
    edges: list[Edge] = field(default_factory=list)
    unit_of: dict[Action, int] = field(default_factory=dict)

    @property
    def n_events(self) -> int:
        return 3 * len(self.units) + len(self.transfers)

    def reach(self, u: int) -> int:
        return 3 * u

    def start(self, u: int) -> int:
        return 3 * u + 1

    def passed(self, u: int) -> int:
        return 3 * u + 2

    def arrive(self, t: int) -> int:
        return 3 * len(self.units) + t

    def owner(self, event: int) -> tuple[str, int]:
        """('unit', u) or ('transfer', t): what an event belongs to."""
        n3 = 3 * len(self.units)
        return ("unit", event // 3) if event < n3 else ("transfer", event - n3)

    def describe_event(self, event: int) -> str:
        kind, i = self.owner(event)
        if kind == "transfer":
            return f"arrival of {self.transfers[i]}"
        u = self.units[i]
        verb = ("reach", "start", "pass")[event % 3]
        return f"{verb} {u} on device {u.device} (column {u.column})"

    def grid(self, unit: int | None) -> str:
        mark = None if unit is None else (self.units[unit].device, self.units[unit].column)
        return format_grid(self.table, mark)


def _same_device_preds(table: ScheduleTable, a: Action, split: set[tuple[int, int]]) -> list[Action]:
    d = table.device_of(a.stage, a.microbatch)
    return [p for p in data_predecessors(a, table.n_stages, split)
            if table.device_of(p.stage, p.microbatch) == d]


def _consumed(table: ScheduleTable, a: Action, split: set[tuple[int, int]]) -> Transfer | None:
    """The transfer compute action `a` receives from another device, if any."""
    s, m = a.stage, a.microbatch
    d = table.device_of(s, m)
    if a.kind is F and s > 0:
        src = table.device_of(s - 1, m)
        if src != d:
            return Transfer(Action(s - 1, F, m), a, src, d, True)
    if a.kind in (I, B) and s + 1 < table.n_stages:
        src = table.device_of(s + 1, m)
        if src != d:
            prod = Action(s + 1, I if (s + 1, m) in split else B, m)
            return Transfer(prod, a, src, d, False)
    return None


def build_event_graph(table: ScheduleTable, semantics: str = "eager") -> EventGraph:
    """Units, transfers and wait edges of `table` (lowered or compute-only) under `semantics`."""
    if semantics not in SEMANTICS:
        raise ConfigError(f"semantics={semantics!r} is unknown; choose one of {', '.join(SEMANTICS)}")
    compute = {a: (d, c) for d, row in enumerate(table.rows) for c, a in enumerate(row)
               if a is not None and a.kind.is_compute}
    split = {(a.stage, a.microbatch) for a in compute if a.kind is I}
    transfers: list[Transfer] = []
    by_recv: dict[Action, int] = {}
    by_send: dict[Action, int] = {}
    by_consumer: dict[Action, int] = {}
    by_producer: dict[Action, int] = {}
    for a in sorted(compute, key=lambda x: compute[x]):
        t = _consumed(table, a, split)
        if t is None:
            continue
        if t.producer not in compute:
            raise ScheduleError(f"{a} needs {t.producer}, which is missing from the table\n"
                                + format_grid(table, compute[a]))
        by_recv[t.recv] = by_send[t.send] = by_consumer[a] = by_producer[t.producer] = len(transfers)
        transfers.append(t)
    lowered = table.is_lowered
    rows: list[list[tuple[int, Action]]] = []
    for d, row in enumerate(table.rows):
        cells: list[tuple[int, Action]] = []
        for c, a in enumerate(row):
            if a is None:
                continue
            if lowered:
                if a.kind.is_comm and a not in by_recv and a not in by_send:
                    raise ScheduleError(f"{a} on device {d} matches no transfer between devices\n"
                                        + format_grid(table, (d, c)))
                cells.append((c, a))
                continue
            if a in by_consumer:
                cells.append((c, transfers[by_consumer[a]].recv))
            cells.append((c, a))
            if a in by_producer:
                cells.append((c, transfers[by_producer[a]].send))
        rows.append(cells)
    units: list[Unit] = []
    for d, cells in enumerate(rows):
        k = 0
        while k < len(cells):
            if semantics == "batched" and cells[k][1].kind.is_comm:
                j = k
                while j < len(cells) and cells[j][1].kind.is_comm:
                    j += 1
                units.append(Unit(d, tuple(cells[k:j])))
                k = j
            else:
                units.append(Unit(d, (cells[k],)))
                k += 1
    g = EventGraph(table, semantics, units, transfers)
    for u, unit in enumerate(units):
        for _, a in unit.cells:
            if a in g.unit_of:
                raise ScheduleError(f"{a} appears twice\n" + format_grid(table, (unit.device, unit.column)))
            g.unit_of[a] = u
    for t in transfers:
        for x in (t.send, t.recv):
            if x not in g.unit_of:
                p = compute[t.producer]
                raise ScheduleError(f"the lowered table lacks {x} of {t}; lower the compute-only "
                                    "table with octopipe.schedule.lower.lower()\n" + format_grid(table, p))
    _add_edges(g, split)
    return g


def _add_edges(g: EventGraph, split: set[tuple[int, int]]) -> None:
    E = g.edges
    prev_on: dict[int, int] = {}
    for u, unit in enumerate(g.units):
        E.append((g.reach(u), g.start(u), RUNS))
        E.append((g.start(u), g.passed(u), RUNS))
        if unit.device in prev_on:
            E.append((g.passed(prev_on[unit.device]), g.reach(u),
                      Why("waits for {} before it in its row", (g.units[prev_on[unit.device]],))))
        prev_on[unit.device] = u
    tindex = {t.recv: i for i, t in enumerate(g.transfers)}
    sindex = {t.send: i for i, t in enumerate(g.transfers)}
    for u, unit in enumerate(g.units):
        for _, a in unit.cells:
            if a.kind.is_compute:
                for p in _same_device_preds(g.table, a, split):
                    if p in g.unit_of:
                        E.append((g.passed(g.unit_of[p]), g.start(u), Why("waits for {} to end", (p,))))
                t = _consumed(g.table, a, split)
                if t is not None:
                    E.append((g.passed(g.unit_of[t.recv]), g.start(u),
                              Why("waits for {} to pass", (t.recv,))))
                    E.append((g.arrive(tindex[t.recv]), g.start(u), Why("waits for {} to arrive", (t,))))
            elif a.kind in (SEND_F, SEND_B):
                t = sindex[a]
                if g.semantics == "rendezvous":
                    E.append((g.reach(g.unit_of[g.transfers[t].recv]), g.passed(u),
                              Why("blocks until {} is posted on device {}", (g.transfers[t].recv, g.transfers[t].dst))))
                if g.semantics == "batched":
                    E.append((g.arrive(t), g.passed(u),
                              Why("waits for its group's transfer {}", (g.transfers[t],))))
            elif g.semantics != "eager":
                t = tindex[a]
                E.append((g.arrive(t), g.passed(u), Why("waits for {} to arrive", (g.transfers[t],))))
    for i, t in enumerate(g.transfers):
        E.append((g.passed(g.unit_of[t.producer]), g.arrive(i), Why("needs {} to end", (t.producer,))))
        E.append((g.reach(g.unit_of[t.send]), g.arrive(i),
                  Why("needs {} posted on device {}", (t.send, t.src))))
        if g.semantics in ("rendezvous", "batched"):
            E.append((g.reach(g.unit_of[t.recv]), g.arrive(i),
                      Why("needs {} posted on device {}", (t.recv, t.dst))))


__all__ = ["RUNS", "SEMANTICS", "Edge", "EventGraph", "Transfer", "Unit", "Why", "build_event_graph"]
