"""Static validation of a compute-only schedule table.

Catches what users get wrong: a (stage, micro-batch) missing, duplicated or out of range; an
action on a device that does not hold its stage; I without W or W before I; and an order that
contradicts the data dependencies (a cycle of waits between device orders and data edges).
Every error names the problem in one sentence and prints the grid with the cell marked.
"""
from __future__ import annotations

from collections import defaultdict

from octopipe.errors import ScheduleError
from octopipe.schedule.action import Action, ActionKind, B, F, I, W
from octopipe.schedule.table import ScheduleTable
from octopipe.schedule.text_grid import format_grid


def _fail(table: ScheduleTable, where, sentence: str) -> ScheduleError:
    return ScheduleError(sentence + "\n" + format_grid(table, where))


def data_predecessors(a: Action, n_stages: int, split: set[tuple[int, int]]) -> list[Action]:
    """Compute actions that must finish before `a` may start (cross-stage and I→W edges).

    `split` holds the (stage, micro-batch) pairs whose backward is split into I and W.
    """
    s, m = a.stage, a.microbatch
    if a.kind is F:
        return [Action(s - 1, F, m)] if s > 0 else []
    if a.kind in (I, B):
        preds = [Action(s, F, m)]
        if s + 1 < n_stages:
            preds.append(Action(s + 1, I if (s + 1, m) in split else B, m))
        return preds
    if a.kind is W:
        return [Action(s, I, m)]
    return []


def validate(table: ScheduleTable) -> None:
    """Raise ScheduleError with a marked grid if `table` (compute actions only) is invalid."""
    n_s, n_m = table.n_stages, table.n_microbatches
    if n_m < 1:
        raise ScheduleError(f"n_microbatches must be at least 1, got {n_m}")
    if n_s < 1:
        raise ScheduleError("placement is empty: a table needs at least one stage")
    where: dict[Action, tuple[int, int]] = {}
    for d, row in enumerate(table.rows):
        for c, a in enumerate(row):
            if a is None:
                continue
            if a.kind.is_comm:
                raise _fail(table, (d, c), f"{a} is a communication action; validate() takes "
                            "compute-only tables (use validate_lowered for lowered ones)")
            if not 0 <= a.stage < n_s:
                raise _fail(table, (d, c), f"{a} names stage {a.stage}, outside 0..{n_s - 1}")
            if not 0 <= a.microbatch < n_m:
                raise _fail(table, (d, c), f"{a} names micro-batch {a.microbatch}, outside 0..{n_m - 1}")
            home = table.device_of(a.stage, a.microbatch)
            if home != d:
                raise _fail(table, (d, c), f"{a} is on device {d} but stage {a.stage} of micro-batch "
                            f"{a.microbatch} is placed on device {home}")
            if a in where:
                raise _fail(table, (d, c), f"{a} appears twice (first at device {where[a][0]}, "
                            f"column {where[a][1]})")
            where[a] = (d, c)
    split: set[tuple[int, int]] = set()
    for s in range(n_s):
        for m in range(n_m):
            fa, ba, ia, wa = (Action(s, k, m) for k in (F, B, I, W))
            if fa not in where:
                user = next((x for x in (ba, ia, wa, Action(s + 1, F, m)) if x in where), None)
                hint = f" ({user} needs it; marked)" if user is not None else ""
                raise _fail(table, where.get(user), f"{fa} is missing: every stage runs F once per "
                            f"micro-batch{hint}")
            has_b, has_i, has_w = ba in where, ia in where, wa in where
            if has_b and (has_i or has_w):
                raise _fail(table, where[ba], f"{ba} is a full backward but {ia if has_i else wa} "
                            "also appears; use either B or the pair I, W")
            if has_i != has_w:
                other = ia if has_i else wa
                missing = wa if has_i else ia
                raise _fail(table, where[other], f"{other} has no matching {missing}: a split "
                            "backward needs both I and W")
            if not (has_b or has_i):
                raise _fail(table, where[fa], f"backward of stage {s} micro-batch {m} is missing "
                            f"(neither {ba} nor {ia}/{wa}; its forward {fa} is marked)")
            if has_i:
                split.add((s, m))
    _check_acyclic(table, where, split)


def _check_acyclic(table: ScheduleTable, where: dict[Action, tuple[int, int]],
                   split: set[tuple[int, int]]) -> None:
    """Kahn's algorithm over data edges plus each device's order; a leftover node is a wait cycle."""
    succ: dict[Action, list[Action]] = defaultdict(list)
    indeg: dict[Action, int] = dict.fromkeys(where, 0)
    for a in where:
        for p in data_predecessors(a, table.n_stages, split):
            if p not in where:
                continue
            if where[p][0] == where[a][0] and where[p][1] > where[a][1]:
                kind = "W before its I" if a.kind is W else "an order that contradicts its data dependencies"
                raise _fail(table, where[a], f"{a} comes before {p} on device {where[a][0]}: "
                            f"{kind} ({a} needs {p} first)")
            succ[p].append(a)
            indeg[a] += 1
    stuck = first_stuck(table, where, succ, indeg)
    if stuck is not None:
        cycle = wait_cycle(stuck, succ, indeg)
        devices = sorted({where[a][0] for a in cycle})
        raise _fail(table, [where[a] for a in cycle],
                    f"the table can never run: {stuck} waits in a cycle of device orders and data "
                    f"dependencies across device(s) {', '.join(map(str, devices))} (no order of execution "
                    f"satisfies both; cycle marked): {describe_cycle(cycle, where)}")


def wait_cycle(stuck: Action, succ: dict[Action, list[Action]], indeg: dict[Action, int]) -> list[Action]:
    """A cycle among the cells Kahn's algorithm left (each has a leftover predecessor), in waiting
    order: each waits for the next, the last for the first."""
    left = {a for a, k in indeg.items() if k > 0}
    preds: dict[Action, list[Action]] = defaultdict(list)
    for p, nexts in succ.items():
        for b in nexts:
            if p in left and b in left:
                preds[b].append(p)
    path, seen, a = [], {}, stuck
    while a not in seen:
        seen[a] = len(path)
        path.append(a)
        a = min(preds[a], key=str)
    return path[seen[a]:]


def describe_cycle(cycle: list[Action], where: dict[Action, tuple[int, int]]) -> str:
    """'0B0 (device 0) needs 1B0 (device 1), which needs ..., which comes after 0B0 in its row'."""
    verbs = []
    for a, b in zip(cycle, cycle[1:] + cycle[:1]):
        same_row = where[a][0] == where[b][0] and where[b][1] < where[a][1]
        verbs.append(f"comes after {b} in its row" if same_row else f"needs {b} (device {where[b][0]})")
    return f"{cycle[0]} (device {where[cycle[0]][0]}) " + ", which ".join(verbs)


def first_stuck(table: ScheduleTable, cells: dict[Action, tuple[int, int]],
                succ: dict[Action, list[Action]], indeg: dict[Action, int]) -> Action | None:
    """Add each device's row order to the wait graph `succ`/`indeg` and run Kahn's algorithm.

    Returns None when every cell can run, else the earliest cell (by column) left in a cycle.
    """
    for row in table.rows:
        acts = [a for a in row if a is not None]
        for x, y in zip(acts, acts[1:]):
            succ[x].append(y)
            indeg[y] += 1
    if kahn(succ, indeg, indeg.keys()) == len(cells):
        return None
    return min((a for a, k in indeg.items() if k > 0), key=lambda a: (cells[a][1], cells[a][0]))


def kahn(succ, indeg, nodes) -> int:
    """Kahn's algorithm on a wait graph: `succ[x]` lists what waits for x, `indeg[x]` counts
    what x waits for (decremented in place; lists or dicts alike). Returns how many of `nodes`
    can run; the rest, in a cycle or behind one, keep `indeg` > 0."""
    ready = [x for x in nodes if indeg[x] == 0]
    seen = 0
    while ready:
        x = ready.pop()
        seen += 1
        for y in succ[x]:
            indeg[y] -= 1
            if indeg[y] == 0:
                ready.append(y)
    return seen


def is_valid(table: ScheduleTable) -> bool:
    try:
        validate(table)
    except ScheduleError:
        return False
    return True


__all__ = ["ActionKind", "data_predecessors", "first_stuck", "is_valid", "validate"]
