"""The shortest schedule table under a memory budget, by exhaustive branch and bound.

The space searched: every table with one stage per device (`p` devices, `m` micro-batches)
whose row on device s is any order of the 3m actions F(s, j), I(s, j), W(s, j), with idle
time allowed anywhere, that runs to the end (no deadlock) and keeps every device within its
activation budget. Full backwards (B) need no search of their own: B(s, j) is I(s, j) then
W(s, j) back to back, except that the stage below waits for all of it, so a table with B is
never faster than the same table with I, W.

Timing follows `octopipe.sim` under strict dispatch and eager messages: an action starts when
its device has ended the one before it in the row and its input has arrived; a transfer leaves
when its producer ends, takes `comm`, and a link direction carries one transfer at a time,
first come first served. F allocates `mem_f` at its start, I frees all but `mem_w` at its end,
W frees `mem_w` at its end; an F may start only if the device then holds at most `max_mem`
(with the tuner's 1e-9 relative slack).

Why timing each row order as early as possible loses nothing: on one device the actions run
one at a time in row order, so when an action starts every earlier one has ended and the
device's memory is a function of the row prefix alone, not of the times; the budget is thus a
constraint on row orders. For fixed rows the links' orders are fixed too (each link direction
carries one device's F outputs or I outputs, in that device's row order), so the start times
are the least solution of max-plus precedences (data edges, row order, link order), and every
end time, the makespan included, is smallest when each action starts as early as possible.

The search appends one action at a time to some device's row, among those whose data
predecessors are already placed, and times it at once; every feasible table arises this way
(append its actions in order of start time). A state is the set of placed actions with the
few times its future depends on: each device's free time, each link's free time and, per
micro-batch, the arrival time of its pending input (at most one: the output of its last F
when its forward has not reached the last stage, else the output of its last I). Micro-batches
are interchangeable, so a state is keyed by its micro-batches sorted, and among micro-batches
in the same state only the first is branched on; appends that commute are tried in one order
only (`_floor_after`). Two pruning rules keep it exact: a lower
bound (a device's free time plus its remaining work, plus the chain of input gradients and
W(0) after its last I; a micro-batch's remaining critical path; the budget's slots, each held
from an F to its I for at least the micro-batch's round trip) at or above the best makespan
found, and dominance (a state with the same placed actions and every time no earlier than one
already expanded has no completion that ends sooner).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from heapq import heapify, heappop, heappush

from octopipe.errors import InfeasibleError
from solvers.zb_auto import ZbInstance

F_, I_, W_ = 0, 1, 2
SLACK = 1e-9        # the tuner's relative slack on a memory budget


@dataclass(frozen=True)
class ExactTable:
    """The optimum: per stage, the (kind, micro-batch) row (kind 0 = F, 1 = I, 2 = W) and its
    makespan; `nodes` states expanded; `proven` False when `max_nodes` stopped the search (the
    table is then only the best found)."""

    rows: tuple[tuple[tuple[int, int], ...], ...]
    makespan: float
    nodes: int
    proven: bool


@dataclass(frozen=True)
class _Chains:
    """Per stage: the lower bounds' fixed tails (seconds)."""

    back_after: tuple[float, ...]    # after stage s's last I: I of every stage below + W(0)
    f_from: tuple[float, ...]        # F from stage s to the last + every I + W(0)
    i_from: tuple[float, ...]        # I from stage s down to 0 + W(0)
    i_down: tuple[float, ...]        # I of the stages below s, with their hops
    f_up: tuple[float, ...]          # F from stage s to the last, with the hops
    hold: tuple[float, ...]          # F(s) start to I(s) end: F up from s, I back down to s
    slots: tuple[int, ...]           # micro-batches stage s can hold from F to I (budget / M_F)


def _chains(inst: ZbInstance) -> _Chains:
    p, c = inst.n_stages, inst.comm
    i_down = tuple(sum(inst.b[:s]) + s * c for s in range(p + 1))
    back_after = tuple(i_down[s] + inst.w[0] for s in range(p))
    i_from = tuple(i_down[s] + inst.b[s] + inst.w[0] for s in range(p))
    f_up = tuple(sum(inst.f[s:]) + (p - 1 - s) * c for s in range(p))
    f_from = tuple(f_up[s] + i_from[p - 1] for s in range(p))
    hold = tuple(f_up[s] + i_down[p] - i_down[s] - c for s in range(p))
    slots = tuple(inst.n_microbatches if inst.mem_f[s] <= 0 or math.isinf(inst.max_mem[s]) else
                  math.floor(inst.max_mem[s] * (1 + SLACK) / inst.mem_f[s] + 1e-9)
                  for s in range(p))
    return _Chains(back_after, f_from, i_from, i_down, f_up, hold, slots)


class _Search:
    """Depth-first branch and bound over partial tables (see the module docstring)."""

    def __init__(self, inst: ZbInstance, max_nodes: int):
        p, m = inst.n_stages, inst.n_microbatches
        self.inst, self.p, self.m, self.max_nodes = inst, p, m, max_nodes
        self.cap = tuple(x * (1 + SLACK) for x in inst.max_mem)
        self.chains = _chains(inst)
        self.tol = 1e-9 * max(max(inst.f), max(inst.b), max(inst.w), inst.comm)
        # per micro-batch: [a, b, wmask, t]: F done on stages < a, I done on stages >= b,
        # W done on the stages in wmask, t the arrival of its pending input
        self.mb = [[0, p, 0, 0.0] for _ in range(m)]
        self.dev = [0.0] * p
        self.link_f = [0.0] * max(p - 1, 0)
        self.link_b = [0.0] * max(p - 1, 0)
        self.mem = [0.0] * p
        self.path: list[tuple[int, int, int]] = []
        self.best = float("inf")
        self.best_path: list[tuple[int, int, int]] = []
        self.memo: dict[tuple, list[tuple]] = {}
        self.nodes = 0
        self.stopped = False

    def wait(self, a: int, b: int, t: float) -> float:
        """The micro-batch's pending arrival, or 0 when it can no longer delay anything (its
        consumer's device is free only later, and a device's free time never goes back)."""
        s = a if a < self.p else b - 1
        return t if 0 <= s < self.p and t > self.dev[s] else 0.0

    def key(self, floor: int) -> tuple[tuple, tuple]:
        """(placed actions, times and floor) with the micro-batches sorted: dominance compares
        the second part. A link's free time counts only while it can delay the next transfer
        (after the next F or I of its device ends)."""
        inst, dev = self.inst, self.dev
        mbs = sorted((a, b, wm, self.wait(a, b, t)) for a, b, wm, t in self.mb)
        lf = (x if x > dev[s] + inst.f[s] else 0.0 for s, x in enumerate(self.link_f))
        lb = (x if x > dev[s + 1] + inst.b[s + 1] else 0.0 for s, x in enumerate(self.link_b))
        return (tuple((a, b, wm) for a, b, wm, _ in mbs),
                (floor, *dev, *lf, *lb, *(t for *_, t in mbs)))

    def dominated(self, floor: int) -> bool:
        """True when a state with the same placed actions, no later times and no higher floor
        was expanded; else remember this one."""
        k, times = self.key(floor)
        seen = self.memo.setdefault(k, [])
        for old in seen:
            if all(x <= y for x, y in zip(old, times)):
                return True
        seen[:] = [old for old in seen if not all(y <= x for x, y in zip(old, times))]
        seen.append(times)
        return False

    def lower_bound(self) -> float:
        """No completion of the current state ends before this: per micro-batch, its remaining
        chain from its earliest next start; per device, the earliest any of its F or I can start
        (a chain's release) plus its remaining work, with the chain of I below it and W(0)
        after its last I."""
        inst, p, c, ch, dev = self.inst, self.p, self.inst.comm, self.chains, self.dev
        rem_f, rem_i, rem_w = [0] * p, [0] * p, [0] * p
        rel = [math.inf] * p            # earliest start of a remaining F or I per stage
        w_ready = [False] * p
        lb = max(dev)
        for a, b, wm, t in self.mb:
            for s in range(p):
                rem_f[s] += s >= a
                rem_i[s] += s < b
                if not (wm >> s) & 1:
                    rem_w[s] += 1
                    w_ready[s] = w_ready[s] or s >= b
            if a < p:
                r = max(t, dev[a])
                lb = max(lb, r + ch.f_from[a])
                for s in range(a, p):
                    rel[s] = min(rel[s], r)
                    r += inst.f[s] + (c if s < p - 1 else 0.0)
                for s in range(p - 1, a - 1, -1):
                    r += inst.b[s] + c
                top = a
            elif b > 0:
                r = max(t, dev[b - 1])
                lb = max(lb, r + ch.i_from[b - 1])
                top = b
            else:
                continue
            for s in range(top - 1, -1, -1):
                rel[s] = min(rel[s], r)
                r += inst.b[s] + c
        for s in range(p):
            start = max(dev[s], rel[s])
            fi = rem_f[s] * inst.f[s] + rem_i[s] * inst.b[s]
            if rem_i[s]:
                lb = max(lb, start + fi + ch.back_after[s])
            first = dev[s] if w_ready[s] else start
            if rem_w[s] or rem_i[s]:
                lb = max(lb, first + fi + rem_w[s] * inst.w[s])
        return lb

    def memory_bound(self) -> float:
        """No completion ends before this: stage s holds a micro-batch's full activations from
        its F(s) start to its I(s) end, at least `hold[s]` later, and at most `slots[s]` at once;
        the micro-batches still to start there, put greedily on the earliest free slot (optimal
        for equal intervals), end their last I(s) no sooner, and the I below and W(0) follow."""
        ch, dev, p, m = self.chains, self.dev, self.p, self.m
        lb = 0.0
        for s in range(p):
            k = ch.slots[s]
            if k >= m:
                continue
            free, new = [], 0
            for a, b, _, t in self.mb:
                if a <= s:
                    new += 1
                elif b > s:         # live on s: its I(s) ends no sooner than its chain allows
                    if a < p:
                        end = max(t, dev[a]) + ch.f_up[a] + ch.i_down[p] - ch.i_down[s] - self.inst.comm
                    else:
                        end = max(t, dev[b - 1]) + ch.i_down[b] - ch.i_down[s] - self.inst.comm
                    free.append(end)
            if not new or k < 1:
                continue
            free += [dev[s]] * (k - len(free))
            heapify(free)
            last = 0.0
            for _ in range(new):
                end = max(heappop(free), dev[s]) + ch.hold[s]
                last = max(last, end)
                heappush(free, end)
            lb = max(lb, last + ch.back_after[s])
        return lb

    def moves(self, floor: int) -> list[tuple[float, int, int, int]]:
        """(start, kind, stage, micro-batch) of every action on a stage >= `floor` that may be
        appended now; one micro-batch per group in the same state."""
        inst, p = self.inst, self.p
        out, seen = [], set()
        for j, (a, b, wm, t) in enumerate(self.mb):
            if (a, b, wm, self.wait(a, b, t)) in seen:
                continue
            seen.add((a, b, wm, self.wait(a, b, t)))
            if floor <= a < p and self.mem[a] + inst.mem_f[a] <= self.cap[a]:
                out.append((max(self.dev[a], t), F_, a, j))
            if a == p and b > floor:
                s = b - 1
                out.append((max(self.dev[s], t) if s < p - 1 else self.dev[s], I_, s, j))
            for s in range(max(b, floor), p):
                if not (wm >> s) & 1:
                    out.append((self.dev[s], W_, s, j))
        out.sort()
        return out

    def apply(self, start: float, kind: int, s: int, j: int) -> tuple:
        """Place the action; return what `undo` needs."""
        inst, st = self.inst, self.mb[j]
        saved = (list(st), self.dev[s], self.mem[s],
                 self.link_f[s] if kind == F_ and s < self.p - 1 else None,
                 self.link_b[s - 1] if kind == I_ and s > 0 else None)
        end = start + (inst.f, inst.b, inst.w)[kind][s]
        self.dev[s] = end
        if kind == F_:
            self.mem[s] += inst.mem_f[s]
            st[0], st[3] = s + 1, 0.0
            if s < self.p - 1:
                st[3] = self.link_f[s] = max(end, self.link_f[s]) + inst.comm
        elif kind == I_:
            self.mem[s] -= inst.mem_f[s] - inst.mem_w[s]
            st[1], st[3] = s, 0.0
            if s > 0:
                st[3] = self.link_b[s - 1] = max(end, self.link_b[s - 1]) + inst.comm
        else:
            self.mem[s] -= inst.mem_w[s]
            st[2] |= 1 << s
        self.path.append((s, kind, j))
        return saved

    def undo(self, s: int, j: int, saved: tuple) -> None:
        self.mb[j][:] = saved[0]
        self.dev[s], self.mem[s] = saved[1], saved[2]
        if saved[3] is not None:
            self.link_f[s] = saved[3]
        if saved[4] is not None:
            self.link_b[s - 1] = saved[4]
        self.path.pop()

    def run(self, depth_left: int, floor: int) -> None:
        """Expand the state; the next append is on a stage >= `floor` (see `_floor_after`)."""
        if depth_left == 0:
            span = max(self.dev)
            if span < self.best:
                self.best, self.best_path = span, list(self.path)
            return
        if self.stopped or max(self.lower_bound(), self.memory_bound()) >= self.best - self.tol \
                or self.dominated(floor):
            return
        self.nodes += 1
        if self.nodes > self.max_nodes:
            self.stopped = True
            return
        for start, kind, s, j in self.moves(floor):
            saved = self.apply(start, kind, s, j)
            self.run(depth_left - 1, _floor_after(kind, s))
            self.undo(s, j, saved)


def _floor_after(kind: int, stage: int) -> int:
    """The lowest stage the next append may be on. Appends on different stages commute unless
    the second consumes the first's output (the same state results in either order), so of
    the orders of one table the search keeps those whose consecutive appends go up the stages
    or follow a data edge; that includes the lexicographically least order of every table
    (stages ranked by index), so no table is lost. A data edge goes up for F and down by one
    for I: after an I on stage s, stage s - 1 stays open."""
    return stage - 1 if kind == I_ and stage > 0 else stage


Rows = tuple[tuple[tuple[int, int], ...], ...]


def time_rows(inst: ZbInstance, rows: Rows) -> float:
    """The makespan of a given table under the search's timing and budget (InfeasibleError when
    it deadlocks, misses an action or an F does not fit)."""
    return _replay(_Search(inst, 0), rows)


def _replay(search: _Search, rows: Rows) -> float:
    """Append the table's actions in an order its rows and data edges allow."""
    p, ptr = search.p, [0] * search.p
    progress = True
    while progress:
        progress = False
        for s in range(p):
            while ptr[s] < len(rows[s]):
                kind, j = rows[s][ptr[s]]
                a, b, wm, t = search.mb[j]
                if kind == F_ and a == s and search.mem[s] + search.inst.mem_f[s] <= search.cap[s]:
                    start = max(search.dev[s], t)
                elif kind == I_ and a == p and b == s + 1:
                    start = max(search.dev[s], t) if s < p - 1 else search.dev[s]
                elif kind == W_ and b <= s and not (wm >> s) & 1:
                    start = search.dev[s]
                else:
                    break
                search.apply(start, kind, s, j)
                ptr[s] += 1
                progress = True
    if len(search.path) != 3 * p * search.m:
        raise InfeasibleError("the table deadlocks, misses actions or exceeds the budget")
    return max(search.dev)


def exhaustive_table(inst: ZbInstance, max_nodes: int = 2_000_000,
                     incumbent: Rows | None = None) -> ExactTable:
    """The shortest table for `inst` (`ZbInstance`: per-stage F, I (its `b`) and W seconds,
    bytes, budget `max_mem`, link time `comm`); InfeasibleError when no table fits the budget
    (or none was found within `max_nodes` expanded states). `incumbent`, a table that fits
    (say a heuristic's), starts the search from its makespan: only shorter tables are then
    looked for, which prunes from the start and leaves the result exact."""
    search = _Search(inst, max_nodes)
    if incumbent is not None:
        seed = _Search(inst, 0)
        search.best, search.best_path = _replay(seed, incumbent), list(seed.path)
    total = 3 * inst.n_stages * inst.n_microbatches
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, total + 100))
    try:
        search.run(total, 0)
    finally:
        sys.setrecursionlimit(limit)
    if not search.best_path:
        raise InfeasibleError(f"no table of {inst.n_stages} stages and {inst.n_microbatches} "
                              f"micro-batches fits {min(inst.max_mem):.4g} bytes per device"
                              + (" (search stopped at max_nodes)" if search.stopped else ""))
    rows: list[list[tuple[int, int]]] = [[] for _ in range(inst.n_stages)]
    for s, kind, j in search.best_path:
        rows[s].append((kind, j))
    return ExactTable(tuple(tuple(r) for r in rows), search.best, search.nodes,
                      not search.stopped)
