"""Ready-first arbitration, one definition for the simulator and the runtime dispatcher.

A hint ranks a device's actions (lower runs first): `table` by row position; `bf` backward
(I, B, W) before forward, each class in row order; `bfw` I and B, then F, then the deferred W.
The dispatcher runs the best-ranked ready action that no buffer cap holds back.

Bounded buffers count micro-batches, not forward actions: a micro-batch is *live* on a device
from its first F there until its last backward (I or B) there. With a cap (`max_inflight`) or
a memory cap set, a device admits micro-batches (runs the F that makes one live) only in the
order its row first names them, and only while fewer than `max_inflight` are live and the
activation bytes plus that F's allocation fit the memory cap. The default cap, `plan`, is each
device's own `row_need` (`row_caps`): what the plan's memory was priced for, and never a deadlock.
`cap_problem` says before a run whether a cap is safe (see docs/runtime.md for the argument) and
why not.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from octopipe.errors import ConfigError
from octopipe.schedule.action import Action, ActionKind

HINTS = ("table", "bf", "bfw")
PLAN = "plan"       # max_inflight: each device's own row's need
KIND_CODE = {ActionKind.F: 0, ActionKind.I: 1, ActionKind.W: 2, ActionKind.B: 3}


def priority(kind_code: np.ndarray, rowpos: np.ndarray, hint: str) -> np.ndarray:
    """Rank of each action (lower runs first) from its kind code (0 F, 1 I, 2 W, 3 B) and its
    position in its device's compute row."""
    kind_code, rowpos = np.asarray(kind_code), np.asarray(rowpos)
    if hint == "table":
        return rowpos.astype(np.int64)
    big = int(rowpos.max(initial=0)) + 1
    if hint == "bf":
        cls = np.where(kind_code == 0, 1, 0)
    elif hint == "bfw":
        cls = np.select([kind_code == 0, kind_code == 2], [1, 2], 0)
    else:
        raise ConfigError(f"hint={hint!r} is unknown; use one of {', '.join(HINTS)}")
    return (cls * big + rowpos).astype(np.int64)


def row_priority(row: Sequence[Action], hint: str) -> dict[Action, int]:
    """`priority` of every action of one device's compute row."""
    codes = np.array([KIND_CODE[a.kind] for a in row], dtype=np.int64)
    return dict(zip(row, priority(codes, np.arange(len(row)), hint).tolist()))


def admits(mb: int, next_mb: int, live: int, cap: int | None, mem: float, alloc: float,
           mem_cap: float | None) -> bool:
    """Whether a device may admit micro-batch `mb` (run the F that makes it live): it is the
    next its row names, fewer than `cap` are live, and its allocation fits `mem_cap`."""
    return mb == next_mb and (cap is None or live < cap) and (mem_cap is None or mem + alloc <= mem_cap)


def admission_order(row: Sequence[Action]) -> list[int]:
    """The micro-batches of a compute row in the order its forwards first name them."""
    seen: dict[int, None] = {}
    for a in row:
        if a.kind is ActionKind.F:
            seen.setdefault(a.microbatch, None)
    return list(seen)


def row_need(row: Sequence[Action]) -> int:
    """The most micro-batches live at once when the row runs in its own order."""
    live: dict[int, int] = {}
    most = 0
    for a in row:
        if a.kind is ActionKind.F:
            live[a.microbatch] = live.get(a.microbatch, 0) + 1
            most = max(most, len(live))
        elif a.kind in (ActionKind.I, ActionKind.B):
            live[a.microbatch] -= 1
            if live[a.microbatch] == 0:
                del live[a.microbatch]
    return most


def row_caps(rows: Sequence[Sequence[Action]], max_inflight: int | Sequence[int] | str | None
             ) -> tuple[int, ...] | None:
    """Per device, its cap on live micro-batches: `PLAN` each row's own `row_need`, an integer
    the same for every device, a sequence as given, None no cap."""
    if max_inflight is None:
        return None
    if isinstance(max_inflight, str):
        if max_inflight != PLAN:
            raise ConfigError(f"max_inflight={max_inflight!r}: give {PLAN!r}, an integer >= 1 or null")
        return tuple(row_need(r) for r in rows)
    if isinstance(max_inflight, (int, np.integer)):
        return (int(max_inflight),) * len(rows)
    return tuple(int(x) for x in max_inflight)


def consistent_orders(rows: Sequence[Sequence[Action]]) -> bool:
    """Whether one order of the micro-batches contains every device's admission order."""
    succ: dict[int, set[int]] = {}
    indeg: dict[int, int] = {}
    for row in rows:
        order = admission_order(row)
        for m in order:
            indeg.setdefault(m, 0)
        for a, b in zip(order, order[1:]):
            if b not in succ.setdefault(a, set()):
                succ[a].add(b)
                indeg[b] += 1
    ready = [m for m, k in indeg.items() if k == 0]
    seen = 0
    while ready:
        m = ready.pop()
        seen += 1
        for b in succ.get(m, ()):
            indeg[b] -= 1
            if indeg[b] == 0:
                ready.append(b)
    return seen == len(indeg)


def cap_problem(rows: Sequence[Sequence[Action]], max_inflight: int | Sequence[int] | str | None,
                memory_cap: bool, ordered: bool = False) -> str | None:
    """Why these caps could deadlock the rows under ready-first dispatch (None: they cannot).

    `max_inflight` as `row_caps` reads it. Safe when every row's own order stays within its cap
    (`row_need`; always so under `PLAN`), or, on a transport that does not hold messages back
    (`ordered` False), when the devices' admission orders are consistent; a memory cap needs the
    latter."""
    need = [row_need(r) for r in rows]
    caps = row_caps(rows, max_inflight)
    if caps is not None and len(caps) != len(rows):
        return f"max_inflight={list(caps)} gives {len(caps)} caps for {len(rows)} ranks; give one per rank"
    short = [d for d in range(len(rows)) if caps is not None and caps[d] < need[d]]
    if not short and not memory_cap:
        return None
    consistent = not ordered and consistent_orders(rows)
    if memory_cap and not consistent:
        return ("memory_cap: the ranks admit micro-batches in conflicting orders (or the ordered "
                "transport holds messages back), so a memory cap could deadlock; drop it or use "
                "max_inflight")
    if short and not consistent:
        d = max(short, key=lambda r: need[r] - caps[r])
        if isinstance(max_inflight, (int, np.integer)):
            d = int(np.argmax(need))
            return (f"max_inflight={max_inflight} could deadlock this table: rank {d}'s row holds "
                    f"{need[d]} micro-batches at once and the ranks admit them in conflicting orders; "
                    f"use max_inflight >= {max(need)}")
        return (f"max_inflight={list(caps)} could deadlock this table: rank {d}'s row holds {need[d]} "
                f"micro-batches at once and the ranks admit them in conflicting orders; give rank {d} "
                f"at least {need[d]} (or max_inflight={PLAN})")
    return None
