"""Shared pieces of the schedule generators: shape checks, lockstep alignment, and
`priority_rows`, the unit-slot list scheduler that builds a table from a priority."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

from octopipe.errors import ScheduleError
from octopipe.schedule.action import Action, B, F, I, W
from octopipe.schedule.table import ScheduleTable, loop_placement, v_placement
from octopipe.schedule.validate import data_predecessors

Row = list["Action | None"]


def require(ok: bool, message: str) -> None:
    """Raise ScheduleError(message) unless `ok`: generators never fix a request silently."""
    if not ok:
        raise ScheduleError(message)


def check_shape(name: str, n_devices: int, n_microbatches: int, chunks: int) -> None:
    require(isinstance(n_devices, int) and n_devices >= 1,
            f"{name}: n_devices must be a positive integer, got {n_devices!r}")
    require(isinstance(n_microbatches, int) and n_microbatches >= 1,
            f"{name}: n_microbatches must be a positive integer, got {n_microbatches!r}")
    require(isinstance(chunks, int) and chunks >= 1,
            f"{name}: chunks (stages per device) must be a positive integer, got {chunks!r}")


PLACEMENT_STYLES = {"loop": loop_placement, "v": v_placement}


def placement_for(name: str, style: str, allowed: Sequence[str], n_devices: int,
                  chunks: int) -> tuple[int, ...]:
    """Stage → device map of a placement style the schedule `name` supports."""
    require(style in allowed, f"{name} supports placement {' or '.join(map(repr, allowed))}, "
            f"got {style!r}")
    return tuple(PLACEMENT_STYLES[style](n_devices, chunks))


def table(rows: Sequence[Sequence[Action | None]], placement: Sequence[int], n_microbatches: int,
          name: str, replicas: Sequence[Sequence[int]] = (), mb_replica: Sequence[int] = ()) -> ScheduleTable:
    return ScheduleTable(tuple(tuple(r) for r in rows), tuple(placement), n_microbatches, name,
                         tuple(tuple(r) for r in replicas), tuple(mb_replica))


def split_pairs(rows: Sequence[Sequence[Action | None]]) -> set[tuple[int, int]]:
    """(stage, micro-batch) pairs whose backward is split into I and W in `rows`."""
    return {(a.stage, a.microbatch) for r in rows for a in r if a is not None and a.kind is I}


def align_lockstep(rows: Sequence[Sequence[Action | None]], n_stages: int) -> list[Row]:
    """Insert idle cells so that no action sits at or before a column holding its producer.

    Every round each device looks at its next cell: an original idle cell is kept, an action
    whose data predecessors all ran in earlier rounds is placed, any other action waits one
    round (an idle cell). This is torch's `_add_bubbles_to_actions` with the full dependency
    rule (torch checks F and B only, so its I cells may sit beside their producers).
    """
    split = split_pairs(rows)
    out: list[Row] = [[] for _ in rows]
    ptr = [0] * len(rows)
    seen: set[Action] = set()
    while any(ptr[d] < len(rows[d]) for d in range(len(rows))):
        placed: list[Action] = []
        progressed = False
        for d, row in enumerate(rows):
            if ptr[d] >= len(row):
                continue
            a = row[ptr[d]]
            if a is None:
                out[d].append(None)
                ptr[d] += 1
                progressed = True
            elif all(p in seen for p in data_predecessors(a, n_stages, split)):
                out[d].append(a)
                placed.append(a)
                ptr[d] += 1
                progressed = True
            else:
                out[d].append(None)
        require(progressed, "the device orders wait on each other in a cycle; no alignment exists")
        seen.update(placed)
    return out


Pool = Hashable


@dataclass(frozen=True)
class Pools:
    """Memory pools of a unit-slot schedule: `of(a)` is the pool an F charges, and an F may start
    only while its pool holds fewer live activations than `caps[pool]` (a pool missing from
    `caps` is unbounded)."""

    of: Callable[[Action], Pool]
    caps: Mapping[Pool, int]


def priority_rows(devices_of: Callable[[Action], int], n_devices: int, n_stages: int,
                  n_microbatches: int, split_backward: bool, priority: Callable[[Action], tuple],
                  pools: Pools, name: str) -> list[Row]:
    """Unit-slot list scheduling: every slot, each idle device runs its best ready action.

    Each compute action takes one slot; an action is ready once its data predecessors finished
    in an earlier slot. An F may start only while its memory pool has room (`pools`); F adds
    one live activation, B (or W when `split_backward`) frees one. Ties go to the smallest
    `priority` key. Returns time-aligned rows.
    """
    pool_of, caps = pools.of, pools.caps
    kinds = (F, I, W) if split_backward else (F, B)
    pending: list[list[Action]] = [[] for _ in range(n_devices)]
    for s in range(n_stages):
        for mb in range(n_microbatches):
            for k in kinds:
                a = Action(s, k, mb)
                pending[devices_of(a)].append(a)
    split_set = ({(s, mb) for s in range(n_stages) for mb in range(n_microbatches)}
                 if split_backward else set())
    preds = {a: data_predecessors(a, n_stages, split_set) for row in pending for a in row}
    for row in pending:
        row.sort(key=priority)
    frees = W if split_backward else B
    done: set[Action] = set()
    live: dict[Pool, int] = defaultdict(int)
    rows: list[Row] = [[] for _ in range(n_devices)]
    remaining = sum(len(p) for p in pending)
    while remaining:
        ran: list[Action] = []
        for d in range(n_devices):
            best = None
            for a in pending[d]:
                if a.kind is F:
                    pool = pool_of(a)
                    if pool in caps and live[pool] >= caps[pool]:
                        continue
                if all(p in done for p in preds[a]):
                    best = a
                    break
            rows[d].append(best)
            if best is not None:
                pending[d].remove(best)
                ran.append(best)
                if best.kind is F:
                    live[pool_of(best)] += 1
                elif best.kind is frees:
                    live[pool_of(Action(best.stage, F, best.microbatch))] -= 1
        if not ran:
            raise ScheduleError(f"{name}: no device can run anything with {remaining} actions left; "
                                f"the memory caps {dict(caps)} are too small for this shape")
        done.update(ran)
        remaining -= len(ran)
    while all(r and r[-1] is None for r in rows):
        for r in rows:
            r.pop()
    return rows

