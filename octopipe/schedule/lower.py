"""Lowering: insert SEND/RECV actions into a compute-only table, and check lowered tables.

Convention (exactly torch.distributed.pipelining's, see `schedules._add_send_recv`):

- ``s SEND_F m``: stage ``s`` sends its forward output of micro-batch ``m`` to the device of
  stage ``s+1``; it sits on the device of stage ``s``, right after ``s F m``.
- ``s RECV_F m``: stage ``s`` receives its input activation of micro-batch ``m`` (the output of
  stage ``s-1``); it sits on the device of stage ``s``, before ``s F m``.
- ``s SEND_B m``: stage ``s`` sends the gradient of its input of micro-batch ``m`` to the device
  of stage ``s-1``; it sits right after ``s I m`` or ``s B m`` (W sends nothing).
- ``s RECV_B m``: stage ``s`` receives the gradient of its output of micro-batch ``m`` (from
  stage ``s+1``); it sits before ``s I m`` or ``s B m``.

So a transfer is the pair (``s SEND_F m``, ``s+1 RECV_F m``) or (``s SEND_B m``,
``s-1 RECV_B m``). Devices are looked up per micro-batch with `ScheduleTable.device_of`, so
replicated placements (Chimera's two pipelines) lower correctly. Two stages on the same
device (the turn of a V, or any co-located neighbours) exchange nothing.

Ordering is torch's: the compute rows are walked round-robin over devices (device 0 first in
each pass); a compute action is emitted once its input is local (the neighbour stage ran on
this device) or its RECV has been emitted; emitting an action that feeds another device emits
the SEND on this device and, at the same moment, the matching RECV on the receiver. The walk is
a global execution order in which every RECV follows its SEND, so under buffered (eager) sends
the lowered table runs without deadlock, and the k-th transfer between two devices in one
direction is the same message on both sides. On tables without replicas the result is
identical to torch's `_add_send_recv` on the same compute rows (tests/schedule/test_lower.py).
"""
from __future__ import annotations

from collections import defaultdict, deque

from octopipe.errors import DeadlockError, ScheduleError
from octopipe.schedule.action import RECV_B, RECV_F, SEND_B, SEND_F, Action, ActionKind, B, F, I
from octopipe.schedule.table import ScheduleTable
from octopipe.schedule.text_grid import format_grid
from octopipe.schedule.validate import first_stuck, validate

Transfer = tuple[Action, Action]


def transfer_of(table: ScheduleTable, a: Action) -> Transfer | None:
    """The (SEND, RECV) pair that compute action `a` triggers, or None when it sends nothing."""
    s, m = a.stage, a.microbatch
    if a.kind is F and s + 1 < table.n_stages:
        if table.device_of(s, m) != table.device_of(s + 1, m):
            return Action(s, SEND_F, m), Action(s + 1, RECV_F, m)
    elif a.kind in (I, B) and s > 0 and table.device_of(s, m) != table.device_of(s - 1, m):
        return Action(s, SEND_B, m), Action(s - 1, RECV_B, m)
    return None


def peer_of(table: ScheduleTable, a: Action) -> int:
    """For a SEND: the receiving device; for a RECV: the sending device."""
    s, m = a.stage, a.microbatch
    other = {SEND_F: s + 1, RECV_F: s - 1, SEND_B: s - 1, RECV_B: s + 1}[a.kind]
    return table.device_of(other, m)


def matching(a: Action) -> Action:
    """The other half of the transfer a SEND or RECV belongs to."""
    s, m = a.stage, a.microbatch
    return {SEND_F: Action(s + 1, RECV_F, m), RECV_F: Action(s - 1, SEND_F, m),
            SEND_B: Action(s - 1, RECV_B, m), RECV_B: Action(s + 1, SEND_B, m)}[a.kind]


def _input_ready(table: ScheduleTable, a: Action, seen: set[Action]) -> bool:
    s, m = a.stage, a.microbatch
    if a.kind is F and s > 0:
        return Action(s, RECV_F, m) in seen or Action(s - 1, F, m) in seen
    if a.kind in (I, B) and s + 1 < table.n_stages:
        return (Action(s, RECV_B, m) in seen or Action(s + 1, I, m) in seen
                or Action(s + 1, B, m) in seen)
    return True


def lower(table: ScheduleTable) -> ScheduleTable:
    """Insert SEND/RECV actions into a valid compute-only table (idle cells are dropped)."""
    if table.is_lowered:
        raise ScheduleError(f"table {table.name!r} already holds SEND/RECV actions; lower() takes "
                            "a compute-only table (use table.compute_only() first)")
    validate(table)
    queues = [deque(table.actions(d)) for d in range(table.n_devices)]
    out: list[list[Action]] = [[] for _ in queues]
    seen: list[set[Action]] = [set() for _ in queues]
    while any(queues):
        progress = False
        for d, q in enumerate(queues):
            if not q or not _input_ready(table, q[0], seen[d]):
                continue
            a = q.popleft()
            out[d].append(a)
            seen[d].add(a)
            t = transfer_of(table, a)
            if t is not None:
                send, recv = t
                out[d].append(send)
                seen[d].add(send)
                r = peer_of(table, send)
                out[r].append(recv)
                seen[r].add(recv)
            progress = True
        if not progress:
            heads = ", ".join(f"device {d} waits at {q[0]}" for d, q in enumerate(queues) if q)
            raise DeadlockError(f"cannot lower table {table.name!r}: no device can proceed ({heads})")
    return table.with_rows(out)


def _fail(table: ScheduleTable, where: tuple[int, int] | None, sentence: str,
          exc: type[ScheduleError] | type[DeadlockError] = ScheduleError) -> Exception:
    return exc(sentence + "\n" + format_grid(table, where))


def validate_lowered(table: ScheduleTable) -> None:
    """Raise ScheduleError (or DeadlockError) with a marked grid if a lowered table is wrong.

    Checks: the compute actions form a valid table; each compute action that feeds another
    device has exactly its SEND after it on its device and the matching RECV before the consumer
    on the peer; no SEND/RECV between stages on the same device; SEND/RECV names are in range;
    the k-th message from device a to device b is the same on both sides; and the rows can run
    to completion under buffered sends (no cycle of waits).
    """
    n_s, n_m = table.n_stages, table.n_microbatches
    where: dict[Action, tuple[int, int]] = {}
    for d, row in enumerate(table.rows):
        for c, a in enumerate(row):
            if a is None or a.kind.is_compute:
                continue
            if not (0 <= a.stage < n_s and 0 <= a.microbatch < n_m):
                raise _fail(table, (d, c), f"{a} names stage {a.stage} or micro-batch "
                            f"{a.microbatch} outside 0..{n_s - 1} / 0..{n_m - 1}")
            home = table.device_of(a.stage, a.microbatch)
            if home != d:
                raise _fail(table, (d, c), f"{a} is on device {d} but stage {a.stage} of micro-batch "
                            f"{a.microbatch} is placed on device {home}")
            partner_stage = matching(a).stage
            if not 0 <= partner_stage < n_s:
                raise _fail(table, (d, c), f"{a} has no partner: stage {partner_stage} does not exist")
            if peer_of(table, a) == d:
                raise _fail(table, (d, c), f"{a} is a transfer between stages {a.stage} and "
                            f"{partner_stage}, which share device {d}; co-located stages exchange nothing")
            if a in where:
                raise _fail(table, (d, c), f"{a} appears twice (first at device {where[a][0]}, "
                            f"column {where[a][1]})")
            where[a] = (d, c)
    validate(table.compute_only())
    pos: dict[Action, tuple[int, int]] = {}
    for d, row in enumerate(table.rows):
        for c, a in enumerate(row):
            if a is not None and a.kind.is_compute:
                pos[a] = (d, c)
    for a, (d, c) in pos.items():
        t = transfer_of(table, a)
        needed = [] if t is None else list(t)
        for x in needed:
            if x not in where:
                raise _fail(table, (d, c), f"{a} feeds device {peer_of(table, t[0])} but {x} is missing")
        if t is not None and where[t[0]][1] < c:
            raise _fail(table, where[t[0]], f"{t[0]} comes before {a}, whose output it sends")
    for x, (d, c) in where.items():
        if x.kind in (SEND_F, SEND_B):
            producer = [Action(x.stage, k, x.microbatch) for k in ((F,) if x.kind is SEND_F else (I, B))]
            if not any(p in pos for p in producer):
                raise _fail(table, (d, c), f"{x} sends an output that no compute action produces")
            continue
        if matching(x) not in where:
            raise _fail(table, (d, c), f"{x} has no matching {matching(x)}")
        consumers = ([Action(x.stage, F, x.microbatch)] if x.kind is RECV_F
                     else [Action(x.stage, I, x.microbatch), Action(x.stage, B, x.microbatch)])
        for u in consumers:
            if u in pos and pos[u][1] < c:
                raise _fail(table, pos[u], f"{u} comes before {x}, which receives its input")
    _check_message_order(table, where)
    _check_runs(table, where, pos)


def _check_message_order(table: ScheduleTable, where: dict[Action, tuple[int, int]]) -> None:
    sends: dict[tuple[int, int], list[Action]] = defaultdict(list)
    recvs: dict[tuple[int, int], list[Action]] = defaultdict(list)
    for x in sorted(where, key=lambda a: where[a]):
        d = where[x][0]
        if x.kind in (SEND_F, SEND_B):
            sends[(d, peer_of(table, x))].append(x)
        else:
            recvs[(peer_of(table, x), d)].append(matching(x))
    for link, sent in sends.items():
        got = recvs.get(link, [])
        for k, (s, r) in enumerate(zip(sent, got)):
            if s != r:
                raise _fail(table, where[matching(r)], f"message {k} from device {link[0]} to device "
                            f"{link[1]} is {s} on the sender but {matching(r)} expects {r}: both sides "
                            "must list their transfers in the same order")


def _check_runs(table: ScheduleTable, where: dict[Action, tuple[int, int]],
                pos: dict[Action, tuple[int, int]]) -> None:
    """Under buffered sends only a RECV waits (for its SEND); detect a cycle of such waits."""
    succ: dict[Action, list[Action]] = defaultdict(list)
    cells = {**pos, **where}
    indeg = dict.fromkeys(cells, 0)
    for x in where:
        if x.kind in (RECV_F, RECV_B):
            succ[matching(x)].append(x)
            indeg[x] += 1
    stuck = first_stuck(table, cells, succ, indeg)
    if stuck is not None:
        raise _fail(table, cells[stuck], f"the lowered table deadlocks: {stuck} waits in a cycle of "
                    "receives and device orders even with buffered sends", DeadlockError)


def is_lowered_valid(table: ScheduleTable) -> bool:
    try:
        validate_lowered(table)
    except (ScheduleError, DeadlockError):
        return False
    return True


__all__ = [
    "ActionKind",
    "is_lowered_valid",
    "lower",
    "matching",
    "peer_of",
    "transfer_of",
    "validate_lowered",
]
