"""The discrete-event engine: flat lists, integer ids, one heap of (time, event) pairs.

Events are `c` (compute node c ends) and `n_compute + t` (transfer t arrives). A link
direction carries one transfer at a time, first come first served: transfers are issued in
time order, so a transfer starts at `max(issue time, end of the link's previous transfer)`.
Compute and communication overlap; a device runs one compute node at a time.

`run_strict` executes each device's row of cells (compute, SEND, RECV; see program.py) in
order, in C (`strict.c`, built by `octopipe.native`) where a compiler exists and in Python
otherwise, step for step the same (`run_strict_py`, its oracle); a run that stalls is replayed
in Python for the stalled state the deadlock analysis reads. `run_ready_first` treats rows as a
ranking and dispatches ready compute nodes. The rules of each communication semantics are in
`octopipe.sim.deadlock`'s docstring.
"""
from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from heapq import heapify, heappop, heappush
from pathlib import Path
from typing import NamedTuple

import numpy as np

from octopipe import native
from octopipe.sim.durations import Durations
from octopipe.sim.hints import admits, priority, row_need
from octopipe.sim.program import CELL_COMPUTE, CELL_SEND, Program

EAGER, RENDEZVOUS, BATCHED = "eager", "rendezvous", "batched"
SEMANTICS = (EAGER, RENDEZVOUS, BATCHED)


@dataclass(frozen=True, eq=False)
class Raw:
    """What one engine run produced; `stuck` is set (and times incomplete) on a deadlock."""

    start: np.ndarray
    end: np.ndarray
    t_start: np.ndarray
    t_end: np.ndarray
    order: tuple[np.ndarray, ...]       # executed compute ids per device, in start order
    peak_act: np.ndarray                # per device, activation bytes
    mem_blocked: np.ndarray             # per device, seconds idle with an F held back by a limit
    stuck: StuckState | None = None


@dataclass(frozen=True, eq=False)
class StuckState:
    """The engine's state when no event is left but work remains (input to deadlock analysis)."""

    pos: list[int]
    c_done: list[bool]
    send_posted: list[bool]
    recv_posted: list[bool]
    prod_done: list[bool]
    arrived: list[bool]
    memory_blocked: list[int]           # ready_first: the best ready F each limited device holds back


_STRICT_SRC = Path(__file__).with_name("strict.c")
_STRICT_LIB: ctypes.CDLL | bool | None = None


def _declare_strict(lib: ctypes.CDLL) -> None:
    i64, vp = ctypes.c_int64, ctypes.c_void_p
    lib.octo_run_strict.argtypes = [i64, i64, i64, i64, ctypes.c_int] + [vp] * 22
    lib.octo_run_strict.restype = ctypes.c_int


def strict_kernel() -> ctypes.CDLL | None:
    """The compiled strict engine, or None (no compiler, or OCTOPIPE_NO_CC)."""
    global _STRICT_LIB
    if _STRICT_LIB is None:
        _STRICT_LIB = native.load(_STRICT_SRC, _declare_strict) or False
    return _STRICT_LIB or None


def _flat_rows(prog: Program) -> tuple[np.ndarray, ...]:
    """The program's arrays as the C engine takes them (int64, contiguous; rows flattened with
    a pointer per device), cached on the program."""
    got = prog._cache.get("strict_c")
    if got is None:
        i64 = lambda a: np.ascontiguousarray(a, dtype=np.int64)
        lens = [len(r) for r in prog.row_type]
        row_ptr = np.zeros(prog.n_devices + 1, dtype=np.int64)
        np.cumsum(lens, out=row_ptr[1:])
        cat = lambda rows: i64(np.concatenate(rows) if len(rows) else np.zeros(0))
        got = (i64(prog.c_dev), i64(prog.c_in_transfer), i64(prog.c_out_transfer), i64(prog.lp_ptr),
               i64(prog.lp_idx), i64(prog.t_src), i64(prog.t_dst), i64(prog.t_link), row_ptr,
               cat(prog.row_type), cat(prog.row_id), cat(prog.row_group_end))
        prog._cache["strict_c"] = got
    return got


def run_strict(prog: Program, dur: Durations, semantics: str = EAGER) -> Raw:
    """Every device runs its row in order under `semantics` (eager, rendezvous or batched): the
    C engine where it is built, else (and for a run that stalls) `run_strict_py`."""
    lib = strict_kernel()
    if lib is None:
        return run_strict_py(prog, dur, semantics)
    n_c, n_t, n_d = prog.n_compute, prog.n_transfers, prog.n_devices
    f64 = lambda a: np.ascontiguousarray(a, dtype=np.float64)
    ins = [*_flat_rows(prog), f64(dur.compute), f64(dur.transfer), f64(dur.alloc), f64(dur.free)]
    start, end = np.empty(n_c), np.empty(n_c)
    t_start, t_end = np.empty(n_t), np.empty(n_t)
    peak, seq = np.empty(n_d), np.empty(max(1, n_c), dtype=np.int64)
    outs = [start, end, t_start, t_end, peak, seq]
    status = lib.octo_run_strict(n_c, n_t, n_d, len(prog.links), SEMANTICS.index(semantics),
                                 *(a.ctypes.data for a in ins + outs))
    if status != 0:
        return run_strict_py(prog, dur, semantics)
    seq = seq[:n_c]
    by_dev = ins[0][seq]
    grouped = seq[np.argsort(by_dev, kind="stable")]
    cuts = np.cumsum(np.bincount(by_dev, minlength=n_d))[:-1]
    return Raw(start, end, t_start, t_end, tuple(np.split(grouped, cuts)), peak, np.zeros(n_d), None)


def run_strict_py(prog: Program, dur: Durations, semantics: str = EAGER) -> Raw:
    """`run_strict` in Python: the fallback, the oracle of `strict.c`, and the replay of a
    stalled run (its `Raw.stuck` is the state the deadlock analysis reads)."""
    L = prog.lists()
    n_c, n_t, n_d = prog.n_compute, prog.n_transfers, prog.n_devices
    c_dev, in_t, out_t = L["c_dev"], L["c_in_transfer"], L["c_out_transfer"]
    lp_ptr, lp_idx = L["lp_ptr"], L["lp_idx"]
    t_src, t_dst, t_link = L["t_src"], L["t_dst"], L["t_link"]
    rtype, rid, rgend = L["row_type"], L["row_id"], L["row_group_end"]
    cdur, tdur = dur.compute.tolist(), dur.transfer.tolist()
    alloc, free = dur.alloc.tolist(), dur.free.tolist()
    eager, batched = semantics == EAGER, semantics == BATCHED
    start = [0.0] * n_c
    end = [-1.0] * n_c
    t_start = [0.0] * n_t
    t_end = [0.0] * n_t
    send_posted = [False] * n_t
    recv_posted = [False] * n_t
    prod_done = [False] * n_t
    issued = [False] * n_t
    arrived = [False] * n_t
    link_free = [0.0] * max(1, len(prog.links))
    pos = [0] * n_d
    rlen = [len(r) for r in rtype]
    busy = [False] * n_d
    mem = [0.0] * n_d
    peak = [0.0] * n_d
    order: list[list[int]] = [[] for _ in range(n_d)]
    heap: list[tuple[float, int]] = []

    def issue(t: int, now: float) -> None:
        if issued[t] or not prod_done[t] or not send_posted[t] or (not eager and not recv_posted[t]):
            return
        issued[t] = True
        lk = t_link[t]
        s = link_free[lk]
        if now > s:
            s = now
        e = s + tdur[t]
        link_free[lk] = e
        t_start[t] = s
        t_end[t] = e
        heappush(heap, (e, n_c + t))

    def advance(d: int, now: float, wake: list[int]) -> None:
        """Run device d's row from its current cell until it blocks or starts a compute node."""
        if busy[d]:
            return
        types, ids, gend = rtype[d], rid[d], rgend[d]
        p = pos[d]
        n = rlen[d]
        while p < n:
            ty = types[p]
            x = ids[p]
            if ty == CELL_COMPUTE:
                for k in range(lp_ptr[x], lp_ptr[x + 1]):
                    if end[lp_idx[k]] < 0.0:
                        pos[d] = p
                        return
                t = in_t[x]
                if t >= 0 and not (recv_posted[t] and arrived[t]):
                    pos[d] = p
                    return
                start[x] = now
                heappush(heap, (now + cdur[x], x))
                busy[d] = True
                order[d].append(x)
                m = mem[d] + alloc[x]
                mem[d] = m
                if m > peak[d]:
                    peak[d] = m
                pos[d] = p + 1
                return
            if batched:
                g = gend[p]
                done = True
                for q in range(p, g):
                    t = ids[q]
                    if types[q] == CELL_SEND:
                        send_posted[t] = True
                    elif not recv_posted[t]:
                        recv_posted[t] = True
                    issue(t, now)
                    if not arrived[t]:
                        done = False
                if not done:
                    pos[d] = p
                    return
                p = g
                continue
            if ty == CELL_SEND:
                send_posted[x] = True
                issue(x, now)
                if not eager and not recv_posted[x]:
                    pos[d] = p
                    return
                p += 1
                continue
            if not recv_posted[x]:
                recv_posted[x] = True
                if not eager:
                    issue(x, now)
                    wake.append(t_src[x])
            if not eager and not arrived[x]:
                pos[d] = p
                return
            p += 1
        pos[d] = p

    wake: list[int] = []
    now = 0.0
    for d in range(n_d):
        advance(d, now, wake)
    while wake:
        advance(wake.pop(), now, wake)
    while heap:
        now, ev = heappop(heap)
        if ev < n_c:
            d = c_dev[ev]
            end[ev] = now
            busy[d] = False
            mem[d] -= free[ev]
            t = out_t[ev]
            if t >= 0:
                prod_done[t] = True
                issue(t, now)
            advance(d, now, wake)
        else:
            t = ev - n_c
            arrived[t] = True
            dd = t_dst[t]
            if not busy[dd]:
                advance(dd, now, wake)
            if batched and not busy[t_src[t]]:
                advance(t_src[t], now, wake)
        while wake:
            advance(wake.pop(), now, wake)
    stuck = None
    if any(pos[d] < rlen[d] for d in range(n_d)) or any(e < 0.0 for e in end):
        stuck = StuckState(pos, [e >= 0.0 for e in end], send_posted, recv_posted, prod_done,
                           arrived, [])
    return Raw(np.array(start), np.array(end), np.array(t_start), np.array(t_end),
               tuple(np.array(o, dtype=np.int64) for o in order), np.array(peak),
               np.zeros(n_d), stuck)


def hint_priority(prog: Program, hint: str) -> list[int]:
    """Rank of each compute node (lower runs first): `octopipe.sim.hints.priority`."""
    return priority(prog.c_kind, prog.c_rowpos, hint).tolist()


def _admission(prog: Program) -> list[list[int]]:
    """Per device, its micro-batches in the order its row's forwards first name them."""
    out: list[list[int]] = []
    for d in range(prog.n_devices):
        seen: dict[int, None] = {}
        for c in prog.row_id[d][prog.row_type[d] == CELL_COMPUTE].tolist():
            if prog.c_kind[c] == 0:
                seen.setdefault(int(prog.c_mb[c]), None)
        out.append(list(seen))
    return out


def row_needs(prog: Program) -> list[int]:
    """Per device, `octopipe.sim.hints.row_need` of its compute row (cached on `prog`): the
    default cap on its live micro-batches under ready_first."""
    if "row_need" not in prog._cache:
        prog._cache["row_need"] = [
            row_need([prog.action(c) for c in prog.row_id[d][prog.row_type[d] == CELL_COMPUTE].tolist()])
            for d in range(prog.n_devices)]
    return list(prog._cache["row_need"])


class _Devices(NamedTuple):
    """The devices' side of `run_ready_first` (`_ready_first_devices` builds it)."""

    start: list[float]
    end: list[float]
    busy: list[bool]
    peak: list[float]
    order: list[list[int]]
    hf: list[list[tuple[int, int]]]
    blocked_total: list[float]
    heap: list[tuple[float, int]]
    ready: Callable[[int, int], None]
    dispatch: Callable[[int, float], None]
    finished: Callable[[int, int, float, float], None]


def _ready_first_devices(prog: Program, dur: Durations, prio, caps: tuple) -> _Devices:
    """Each device's ready queues (F apart from I/W/B, by hint priority), live micro-batches and
    memory, with the closures that queue a ready node (`ready`), start a device's best
    admissible ready node (`dispatch`) and end a node (`finished`); closures over these locals
    keep the event loop's per-action work as cheap as inline code."""
    L = prog.lists()
    n_c, n_d = prog.n_compute, prog.n_devices
    c_kind, c_mb = L["c_kind"], prog.c_mb.tolist()
    cdur, alloc = dur.compute.tolist(), dur.alloc.tolist()
    start, end = [0.0] * n_c, [-1.0] * n_c
    busy, mem, peak = [False] * n_d, [0.0] * n_d, [0.0] * n_d
    cap_n = list(caps[0]) if caps[0] is not None else None
    cap_b = list(caps[1]) if caps[1] is not None else None
    gated = cap_n is not None or cap_b is not None
    adm = _admission(prog) if gated else []
    adm_next = [0] * n_d
    n_mb = prog.n_microbatches
    live = [[0] * n_mb for _ in range(n_d)]
    started = [[False] * n_mb for _ in range(n_d)]
    n_live = [0] * n_d
    blocked_since, blocked_total = [-1.0] * n_d, [0.0] * n_d
    order: list[list[int]] = [[] for _ in range(n_d)]
    hf: list[list[tuple[int, int]]] = [[] for _ in range(n_d)]
    hb: list[list[tuple[int, int]]] = [[] for _ in range(n_d)]
    heap: list[tuple[float, int]] = []

    def ready(d: int, c: int) -> None:
        heappush(hf[d] if c_kind[c] == 0 else hb[d], (prio[c], c))

    def allowed(d: int, c: int) -> bool:
        m = c_mb[c]
        if started[d][m]:
            return True
        nxt = adm[d][adm_next[d]] if adm_next[d] < len(adm[d]) else -1
        return admits(m, nxt, n_live[d], None if cap_n is None else cap_n[d], mem[d], alloc[c],
                      None if cap_b is None else cap_b[d])

    def dispatch(d: int, now: float) -> None:
        b = hb[d]
        f = hf[d]
        pick = -1
        held = False
        if f:
            top = f[0]
            if gated and not allowed(d, top[1]):
                held = True
                top = next((e for e in sorted(f) if allowed(d, e[1])), None)
                if top is not None and (not b or top[0] < b[0][0]):
                    f.remove(top)
                    heapify(f)
                    pick = top[1]
            elif not b or top[0] < b[0][0]:
                pick = heappop(f)[1]
        if pick < 0 and b:
            pick = heappop(b)[1]
        if pick < 0:
            if held and blocked_since[d] < 0.0:
                blocked_since[d] = now
            return
        if blocked_since[d] >= 0.0:
            blocked_total[d] += now - blocked_since[d]
            blocked_since[d] = -1.0
        busy[d] = True
        start[pick] = now
        order[d].append(pick)
        if gated and c_kind[pick] == 0:
            m = c_mb[pick]
            if not started[d][m]:
                started[d][m] = True
                adm_next[d] += 1
                n_live[d] += 1
            live[d][m] += 1
        m = mem[d] + alloc[pick]
        mem[d] = m
        if m > peak[d]:
            peak[d] = m
        heappush(heap, (now + cdur[pick], pick))

    def finished(d: int, c: int, now: float, freed: float) -> None:
        end[c] = now
        busy[d] = False
        mem[d] -= freed
        k = c_kind[c]
        if gated and (k == 1 or k == 3):
            m = c_mb[c]
            live[d][m] -= 1
            if live[d][m] == 0:
                n_live[d] -= 1

    return _Devices(start, end, busy, peak, order, hf, blocked_total, heap, ready, dispatch, finished)


def run_ready_first(prog: Program, dur: Durations, hint: str = "table",
                    max_inflight: Sequence[int] | None = None,
                    mem_limit: Sequence[float] | None = None) -> Raw:
    """An idle device runs its best-ranked ready compute node (messages are eager).

    `max_inflight[d]` caps the micro-batches live on device d and `mem_limit[d]` its activation
    bytes at each admission, as `octopipe.sim.hints` defines (the runtime dispatcher's rule).
    """
    key = f"prio:{hint}"
    if key not in prog._cache:
        prog._cache[key] = hint_priority(prog, hint)
    L = prog.lists()
    n_c, n_t, n_d = prog.n_compute, prog.n_transfers, prog.n_devices
    c_dev, in_t, out_t = L["c_dev"], L["c_in_transfer"], L["c_out_transfer"]
    lp_ptr, ls_ptr, ls_idx = L["lp_ptr"], L["ls_ptr"], L["ls_idx"]
    t_dst, t_link, t_cons = L["t_dst"], L["t_link"], L["t_consumer"]
    tdur, free = dur.transfer.tolist(), dur.free.tolist()
    need = [lp_ptr[c + 1] - lp_ptr[c] + (1 if in_t[c] >= 0 else 0) for c in range(n_c)]
    t_start = [0.0] * n_t
    t_end = [0.0] * n_t
    link_free = [0.0] * max(1, len(prog.links))
    dev = _ready_first_devices(prog, dur, prog._cache[key], (max_inflight, mem_limit))
    heap, busy, ready, dispatch = dev.heap, dev.busy, dev.ready, dev.dispatch
    for c in range(n_c):
        if need[c] == 0:
            ready(c_dev[c], c)
    for d in range(n_d):
        dispatch(d, 0.0)
    dirty: set[int] = set()
    while heap:
        now = heap[0][0]
        while heap and heap[0][0] == now:
            _, ev = heappop(heap)
            if ev < n_c:
                d = c_dev[ev]
                dev.finished(d, ev, now, free[ev])
                dirty.add(d)
                for j in range(ls_ptr[ev], ls_ptr[ev + 1]):
                    s = ls_idx[j]
                    need[s] -= 1
                    if need[s] == 0:
                        ready(d, s)
                t = out_t[ev]
                if t >= 0:
                    lk = t_link[t]
                    s0 = link_free[lk]
                    if now > s0:
                        s0 = now
                    e = s0 + tdur[t]
                    link_free[lk] = e
                    t_start[t] = s0
                    t_end[t] = e
                    heappush(heap, (e, n_c + t))
            else:
                t = ev - n_c
                c = t_cons[t]
                need[c] -= 1
                if need[c] == 0:
                    ready(t_dst[t], c)
                    dirty.add(t_dst[t])
        for d in sorted(dirty):
            if not busy[d]:
                dispatch(d, now)
        dirty.clear()
    stuck = None
    if any(e < 0.0 for e in dev.end):
        held = [dev.hf[d][0][1] for d in range(n_d) if dev.hf[d]]
        stuck = StuckState([len(o) for o in dev.order], [e >= 0.0 for e in dev.end], [], [], [], [], held)
    return Raw(np.array(dev.start), np.array(dev.end), np.array(t_start), np.array(t_end),
               tuple(np.array(o, dtype=np.int64) for o in dev.order), np.array(dev.peak),
               np.array(dev.blocked_total), stuck)
