"""The idealized table: a schedule on unit-time slots, communication free.

The second of the three abstraction levels (formula → idealized table → simulation). Every
device runs its row in strict order; an action starts as soon as the previous action of its row
and its data predecessors (`validate.data_predecessors`) have ended; transfers take no time.
Durations come from `SlotCosts`: either one slot per compute action (`SlotCosts.unit()`), or
forward, input-gradient and weight-gradient costs in a ratio such as ``1:1:1`` (F:I:W) with a
full backward costing ``B = I + W`` (so ``1:1:1`` gives F=1, B=2, the uniform-stage case of
the zero-bubble paper, and GPipe/1F1B recover ``(p-1)/(m+p-1)``).

An activation (one stage, one micro-batch) is live from the start of its F to the end of the
action that frees it: B for a full backward, W for a split one (I keeps what W needs). At a
time where one action frees and another allocates, the free happens first.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from octopipe.errors import ScheduleError
from octopipe.schedule.action import Action, ActionKind, B, F, I, W
from octopipe.schedule.table import ScheduleTable
from octopipe.schedule.validate import data_predecessors, validate


@dataclass(frozen=True)
class SlotCosts:
    """Slot counts per compute kind; `b` is the full backward (None: i + w)."""

    f: float = 1.0
    i: float = 1.0
    w: float = 1.0
    b: float | None = None

    def __post_init__(self) -> None:
        for name in ("f", "i", "w", "b"):
            v = getattr(self, name)
            if v is not None and not v >= 0:
                raise ScheduleError(f"slot cost {name}={v} must be a non-negative number")
        if self.f <= 0:
            raise ScheduleError(f"slot cost f={self.f} must be positive")

    @classmethod
    def unit(cls) -> SlotCosts:
        """Every compute action one slot, a full backward included."""
        return cls(1.0, 1.0, 1.0, 1.0)

    @classmethod
    def parse(cls, ratio: str) -> SlotCosts:
        """`"F:I:W"` such as `"1:1:1"` or `"1:2:1"`; `"unit"` for one slot per action."""
        if ratio.strip() == "unit":
            return cls.unit()
        parts = ratio.split(":")
        try:
            f, i, w = (float(x) for x in parts)
        except ValueError:
            raise ScheduleError(f"slot ratio {ratio!r} must be 'unit' or three numbers F:I:W such "
                                "as '1:1:1' (a full backward then costs I+W)") from None
        return cls(f, i, w)

    def of(self, kind: ActionKind) -> float:
        if kind is F:
            return self.f
        if kind is I:
            return self.i
        if kind is W:
            return self.w
        if kind is B:
            return self.i + self.w if self.b is None else self.b
        raise ScheduleError(f"{kind} is a communication kind: the idealized table times compute only")


@dataclass(frozen=True, eq=False)
class IdealizedTable:
    """Start and end slot of every compute action, with the figures the slots give.

    Arrays are aligned with `actions`: `device[k]`, `start[k]`, `end[k]`. Lifetimes are aligned
    with `lifetime_keys` ((stage, micro-batch) pairs): `born`, `freed`, `lifetime_device`.
    """

    table: ScheduleTable
    costs: SlotCosts
    actions: tuple[Action, ...]
    device: np.ndarray
    start: np.ndarray
    end: np.ndarray
    lifetime_keys: tuple[tuple[int, int], ...]
    lifetime_device: np.ndarray
    born: np.ndarray
    freed: np.ndarray

    @property
    def n_devices(self) -> int:
        return self.table.n_devices

    @property
    def makespan(self) -> float:
        """The schedule length in slots."""
        return float(self.end.max()) if len(self.end) else 0.0

    @property
    def busy(self) -> np.ndarray:
        """Busy slots per device."""
        return np.bincount(self.device, weights=self.end - self.start, minlength=self.n_devices)

    @property
    def idle_ratio(self) -> np.ndarray:
        """Idle fraction of the schedule length, per device."""
        span = self.makespan
        return 1.0 - self.busy / span if span > 0 else np.zeros(self.n_devices)

    @property
    def bubble_ratio(self) -> float:
        """Idle slots over all device slots (the mean of `idle_ratio`)."""
        return float(self.idle_ratio.mean())

    def peak_inflight(self) -> np.ndarray:
        """Peak number of live activations (one stage, one micro-batch each) per device."""
        peak = np.zeros(self.n_devices, dtype=np.int64)
        for d in range(self.n_devices):
            sel = self.lifetime_device == d
            times = np.concatenate([self.freed[sel], self.born[sel]])
            deltas = np.concatenate([-np.ones(sel.sum(), np.int64), np.ones(sel.sum(), np.int64)])
            order = np.lexsort((deltas, times))  # by time, frees (-1) before allocations
            live = np.cumsum(deltas[order])
            peak[d] = int(live.max()) if len(live) else 0
        return peak

    def lifetime(self, stage: int, microbatch: int) -> tuple[float, float]:
        k = self.lifetime_keys.index((stage, microbatch))
        return float(self.born[k]), float(self.freed[k])

    def span(self, action: Action) -> tuple[float, float]:
        k = self.actions.index(action)
        return float(self.start[k]), float(self.end[k])

    def rows(self) -> Iterator[tuple[str, str, float, float, str]]:
        """(lane label, kind, start, end, action text) per action: `render.bars_trace`'s bars."""
        for k, a in enumerate(self.actions):
            yield (f"dev {int(self.device[k])}", a.kind.value, float(self.start[k]),
                   float(self.end[k]), str(a))

    def slot_grid(self) -> ScheduleTable:
        """A time-aligned table: each action in its start slot, every other slot empty.

        With integer costs this is a valid table whose compact form is the input's; the slots an
        action continues into are empty cells too (use `rows()` for exact spans).
        """
        ends = np.concatenate([self.start, self.end])
        if not np.allclose(ends, np.round(ends)):
            raise ScheduleError("slot_grid needs integer slot costs; use rows() for fractional ones")
        length = int(round(self.makespan))
        grid: list[list[Action | None]] = [[None] * length for _ in range(self.n_devices)]
        for k, a in enumerate(self.actions):
            d, t = int(self.device[k]), int(round(self.start[k]))
            if grid[d][t] is not None:
                raise ScheduleError(f"{grid[d][t]} and {a} both start in slot {t} on device {d}: "
                                    "slot_grid needs positive costs for every kind")
            grid[d][t] = a
        return self.table.with_rows(grid)


def idealize(table: ScheduleTable, costs: SlotCosts | str = "unit") -> IdealizedTable:
    """Time a valid table on slots: strict row order, data dependencies, free communication."""
    costs = SlotCosts.parse(costs) if isinstance(costs, str) else costs
    table = table.compute_only().compact()
    validate(table)
    n_s = table.n_stages
    split = {(a.stage, a.microbatch) for _, a in table if a.kind is I}
    acts: list[Action] = []
    dev: list[int] = []
    index: dict[Action, int] = {}
    for d, row in enumerate(table.rows):
        for a in row:
            index[a] = len(acts)
            acts.append(a)
            dev.append(d)
    succ: list[list[int]] = [[] for _ in acts]
    indeg = np.zeros(len(acts), dtype=np.int64)
    for k, a in enumerate(acts):
        for p in data_predecessors(a, n_s, split):
            succ[index[p]].append(k)
            indeg[k] += 1
    for row in table.rows:
        for x, y in zip(row, row[1:]):
            succ[index[x]].append(index[y])
            indeg[index[y]] += 1
    dur = np.array([costs.of(a.kind) for a in acts], dtype=float)
    start = np.zeros(len(acts))
    end = np.zeros(len(acts))
    ready = deque(int(k) for k in np.flatnonzero(indeg == 0))
    while ready:
        k = ready.popleft()
        end[k] = start[k] + dur[k]
        for j in succ[k]:
            start[j] = max(start[j], end[k])
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    keys = tuple(sorted({(a.stage, a.microbatch) for a in acts}))
    born = np.array([start[index[Action(s, F, m)]] for s, m in keys])
    freed = np.array([end[index[Action(s, W if (s, m) in split else B, m)]] for s, m in keys])
    ldev = np.array([dev[index[Action(s, F, m)]] for s, m in keys], dtype=np.int64)
    return IdealizedTable(table, costs, tuple(acts), np.array(dev, dtype=np.int64), start, end,
                          keys, ldev, born, freed)


__all__ = ["IdealizedTable", "SlotCosts", "idealize"]
