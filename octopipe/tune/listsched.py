"""The tuner's cheap estimator: a list scheduler with transfer delays (and, optionally, links
that carry one transfer at a time, as the simulator's do).

`list_schedule` runs the C engine in `listsched.c` (compiled once with the system C compiler and
cached, `octopipe.native`), or the same algorithm in Python when no compiler is available.
`PackedStages` is the tuner's fast path: a layout's arrays built in C as well, from a problem's
`StageTables`, and estimated under a `PackedPolicy` in one call. The OctoPipe authors' tuner
ranks thousands of candidates with such an estimator and fully simulates only the best few; the
executed order it returns is also how the tuner turns a priority policy into a frozen table.
"""
from __future__ import annotations

import ctypes
import math
import struct
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from octopipe import native

_SRC = Path(__file__).with_name("listsched.c")
_LIB: ctypes.CDLL | bool | None = None
_ZERO = array("d", [0.0])


@dataclass(frozen=True)
class StageArrays:
    """Per-stage numbers the estimator needs, for one partition and placement."""

    dev: np.ndarray        # [S] device of each stage (int32)
    dur: np.ndarray        # [S, 3] F, I (or B), W seconds on the stage's device
    comm_f: np.ndarray     # [S] delay of stage s's activations reaching s+1
    comm_b: np.ndarray     # [S] delay of stage s's input gradient reaching s-1
    act: np.ndarray        # [S] activation bytes one micro-batch keeps from F to backward
    free_i: np.ndarray     # [S] bytes freed by I (the rest is freed by W)
    cap: np.ndarray        # [D] activation capacity per device (bytes; -1 = unbounded)
    n_devices: int
    contention: bool = False   # each directed device pair carries one transfer at a time

    @property
    def n_stages(self) -> int:
        return len(self.dev)


@dataclass(frozen=True, eq=False)
class ListPolicy:
    """How the list scheduler picks the next action (see listsched.c).

    split_backward: I and W as separate actions (else one B); limits[s] caps the micro-batches in flight
    on stage s (0 = no cap); kind_rank orders F, I, W (lower first); f_tiebreak 0: lowest
    micro-batch first, 1: deepest stage first; b_tiebreak 0: deepest stage first, 1: lowest
    micro-batch first; W jumps ahead once a device's activations exceed w_pressure × capacity.
    """

    split_backward: bool
    limits: np.ndarray
    kind_rank: tuple[int, int, int] = (1, 0, 2)
    f_tiebreak: int = 0
    b_tiebreak: int = 0
    w_pressure: float = 2.0


@dataclass(frozen=True)
class ListResult:
    """Outcome of one list-scheduling run; `complete` is False when the limits deadlock."""

    makespan: float
    start: np.ndarray      # [S, 3, M] start seconds, -1 where not run
    order: np.ndarray      # action ids in the order they were started
    peak: np.ndarray       # [D] peak activation bytes
    complete: bool


def _declare(lib: ctypes.CDLL) -> None:
    f = lib.octo_list_schedule
    # arrays go in as raw addresses (list_schedule makes them contiguous, of the right dtype,
    # and keeps them alive): ndpointer's per-argument checks cost more than the schedule
    ip = dp = ctypes.c_void_p
    f.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ip, dp, dp, dp, dp, dp,
                  dp, ip, ip, ctypes.c_int, ctypes.c_int, ctypes.c_double, ctypes.c_int,
                  ctypes.c_double, dp, ip, dp, ctypes.POINTER(ctypes.c_double)]
    f.restype = ctypes.c_int
    f = lib.octo_stage_arrays
    f.argtypes = [ip, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, dp]
    f.restype = ctypes.c_int
    f = lib.octo_estimate
    f.argtypes = [ip, ip, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, dp, ctypes.c_int, ctypes.c_double]
    f.restype = ctypes.c_double


def _lib() -> ctypes.CDLL | None:
    global _LIB
    if _LIB is None:
        _LIB = native.load(_SRC, _declare) or False
    return _LIB or None


def c_kernel_available() -> bool:
    """True when the C engine is in use (False: the Python fallback)."""
    return _lib() is not None


def _stage_pointers(arr: StageArrays) -> list[int]:
    """Raw addresses of `arr`'s arrays as the C engine takes them, kept on `arr` with contiguous
    copies where needed (a problem reuses one StageArrays across the policies it estimates)."""
    got = arr.__dict__.get("_ptrs")
    if got is None:
        i32, f64 = np.int32, np.float64
        keep = (np.ascontiguousarray(arr.dev, dtype=i32), np.ascontiguousarray(arr.dur, dtype=f64),
                np.ascontiguousarray(arr.comm_f, dtype=f64),
                np.ascontiguousarray(arr.comm_b, dtype=f64), np.ascontiguousarray(arr.act, dtype=f64),
                np.ascontiguousarray(arr.free_i, dtype=f64), np.ascontiguousarray(arr.cap, dtype=f64))
        got = ([a.__array_interface__["data"][0] for a in keep], keep)
        object.__setattr__(arr, "_ptrs", got)
    return got[0]


def list_schedule(arr: StageArrays, n_microbatches: int, policy: ListPolicy,
                  use_c: bool | None = None) -> ListResult:
    """Schedule every action of `arr` for `n_microbatches` under `policy` (C engine unless
    `use_c` is False or no compiler exists)."""
    S, M, D = arr.n_stages, int(n_microbatches), arr.n_devices
    split_backward = policy.split_backward
    limits = np.ascontiguousarray(policy.limits, dtype=np.int32)
    lib = _lib() if use_c in (None, True) else None
    if lib is None or use_c is False:
        return _list_schedule_py(arr, M, policy, limits)
    start = np.empty(S * 3 * M, dtype=np.float64)
    order = np.empty(S * 3 * M, dtype=np.int32)
    peak = np.zeros(D, dtype=np.float64)
    ms = ctypes.c_double(0.0)
    kind_rank = np.ascontiguousarray(policy.kind_rank, dtype=np.int32)
    ptr = [*_stage_pointers(arr), limits.__array_interface__["data"][0],
           kind_rank.__array_interface__["data"][0]]
    done = lib.octo_list_schedule(
        S, M, D, int(split_backward), *ptr, int(policy.f_tiebreak), int(policy.b_tiebreak),
        float(policy.w_pressure), int(arr.contention), math.inf, start.__array_interface__["data"][0],
        order.__array_interface__["data"][0], peak.__array_interface__["data"][0], ctypes.byref(ms))
    total = S * M * (3 if split_backward else 2)
    return ListResult(ms.value if done == total else math.inf, start.reshape(S, 3, M),
                      order[:done].copy(), peak, done == total)


def list_makespan(arr: StageArrays, n_microbatches: int, policy: ListPolicy,
                  bound: float = math.inf) -> float:
    """`list_schedule(...).makespan` alone (inf when the limits deadlock), or NaN once the
    makespan provably exceeds a finite `bound` (the C engine then stops early; the Python fallback
    never does). The NaN is a proof of `makespan > bound`, not a value: the engine stops when its
    lower bound passes `bound` by 1e-9 (relative, plus 1e-9 s), far above its rounding and the
    1e-12 tie tolerance by which starts may step back."""
    lib = _lib()
    if lib is None:
        return float(_list_schedule_py(arr, int(n_microbatches), policy,
                                       np.ascontiguousarray(policy.limits, dtype=np.int32)).makespan)
    S, M = arr.n_stages, int(n_microbatches)
    limits = np.ascontiguousarray(policy.limits, dtype=np.int32)
    kind_rank = np.ascontiguousarray(policy.kind_rank, dtype=np.int32)
    peak = np.empty(arr.n_devices, dtype=np.float64)
    ms = ctypes.c_double(0.0)
    done = lib.octo_list_schedule(
        S, M, arr.n_devices, int(policy.split_backward), *_stage_pointers(arr),
        limits.__array_interface__["data"][0], kind_rank.__array_interface__["data"][0],
        int(policy.f_tiebreak), int(policy.b_tiebreak), float(policy.w_pressure),
        int(arr.contention), float(bound) + 1e-9 * (abs(float(bound)) + 1.0) if math.isfinite(bound) else math.inf,
        None, None, peak.__array_interface__["data"][0], ctypes.byref(ms))
    if done < 0:
        return math.nan
    return ms.value if done == S * M * (3 if policy.split_backward else 2) else math.inf


class _Tables(ctypes.Structure):
    _fields_ = [("n_devices", ctypes.c_int), ("n_kinds", ctypes.c_int), ("contention", ctypes.c_int),
                ("has_b", ctypes.c_int),
                *((name, ctypes.c_void_p) for name in ("kind_col", "pfiw", "p1", "out_bytes", "lat", "bw",
                                                        "memory", "budget")),
                ("action_s", ctypes.c_double)]


class _Policy(ctypes.Structure):
    _fields_ = [("split_backward", ctypes.c_int), ("f_tiebreak", ctypes.c_int), ("b_tiebreak", ctypes.c_int),
                ("kind_rank", ctypes.c_int * 3), ("w_pressure", ctypes.c_double), ("limit", ctypes.c_void_p)]


@dataclass(frozen=True, eq=False)
class StageTables:
    """A problem's per-layer inputs to `PackedStages`, in the C engine's `Tables` (`addr`), with
    the arrays it points into (`keep`)."""

    n_devices: int
    contention: bool
    addr: int
    keep: tuple


def stage_tables(kind_col: np.ndarray, prefixes: tuple[np.ndarray, np.ndarray], out_bytes: np.ndarray,
                 links: tuple[np.ndarray, np.ndarray], memory: np.ndarray, budget: np.ndarray | None,
                 contention: bool, backward: tuple[bool, float] = (False, 0.0)) -> StageTables:
    """The tables for `kind_col` [D] (each device's cost-table column), the prefix sums of F, I, W
    and B [L + 1, kinds, 4] and of act, w_act and static bytes [L + 1, 3], out bytes [L], link
    latency and bandwidth [D, D], memory [D] and the activation budget [D] or None; `backward` =
    (whether a B costs its own column rather than I + W, the host seconds of each action)."""
    arrays = (np.ascontiguousarray(kind_col, dtype=np.int64),
              *(np.ascontiguousarray(a, dtype=np.float64) for a in (*prefixes, out_bytes, *links, memory)))
    if budget is not None:
        arrays += (np.ascontiguousarray(budget, dtype=np.float64),)
    pointers = [a.ctypes.data for a in arrays] + [None] * (8 - len(arrays))
    t = _Tables(len(memory), prefixes[0].shape[1], int(contention), int(backward[0]), *pointers,
                float(backward[1]))
    return StageTables(len(memory), bool(contention), ctypes.addressof(t), (t, arrays))


@dataclass(frozen=True, eq=False)
class PackedPolicy:
    """A `ListPolicy` in the C engine's `Policy` (`addr`), with what it points into (`keep`)."""

    addr: int
    keep: tuple


def pack_policy(policy: ListPolicy) -> PackedPolicy:
    """`policy` for `PackedStages.estimate` (pack once, estimate many layouts)."""
    limits = np.ascontiguousarray(policy.limits, dtype=np.int32)
    p = _Policy(int(policy.split_backward), int(policy.f_tiebreak), int(policy.b_tiebreak),
                (ctypes.c_int * 3)(*policy.kind_rank), float(policy.w_pressure), limits.ctypes.data)
    return PackedPolicy(ctypes.addressof(p), (p, limits))


_LAYOUTS: dict[int, Callable[..., bytes]] = {}


class PackedStages:
    """One layout's estimator inputs in memory the C engine fills (on first use) and reads:
    `layout` (the stage sizes, then the stage devices, as C ints) and `buf` (dur [S, 3], comm_f,
    comm_b, act, free_i [S] and cap [D]; see `octo_stage_arrays`)."""

    __slots__ = ("_view", "buf", "filled", "layout", "n_stages", "split_backward", "tables")

    def __init__(self, tables: StageTables, sizes: tuple[int, ...], placement: tuple[int, ...],
                 split_backward: bool) -> None:
        S = self.n_stages = len(sizes)
        self.split_backward = bool(split_backward)
        pack = _LAYOUTS.get(S)
        if pack is None:
            pack = _LAYOUTS[S] = struct.Struct(f"{2 * S}i").pack
        self.tables, self.layout, self.buf = tables, pack(*sizes, *placement), _ZERO * (7 * S + tables.n_devices)
        self.filled = False
        self._view: StageArrays | None = None

    def estimate(self, n_microbatches: int, policy: PackedPolicy, bound: float = math.inf) -> float:
        """`list_makespan` of these stages under `policy` (of the same split backward; see
        `octo_estimate`): the same value, inf when a capacity is negative or the limits
        deadlock, or NaN above a finite `bound`."""
        b = float(bound) + 1e-9 * (abs(float(bound)) + 1.0) if math.isfinite(bound) else math.inf
        v = _LIB.octo_estimate(self.tables.addr, policy.addr, self.n_stages, int(n_microbatches),
                               self.layout, self.buf.buffer_info()[0], not self.filled, b)
        self.filled = True          # after the call: another thread meanwhile fills it again, alike
        return v

    def arrays(self) -> StageArrays:
        """The same numbers as read-only `StageArrays` (views of this memory)."""
        if self._view is None:
            S, D = self.n_stages, self.tables.n_devices
            if not self.filled:
                _LIB.octo_stage_arrays(self.tables.addr, S, int(self.split_backward), self.layout,
                                       self.buf.buffer_info()[0])
                self.filled = True
            dev = np.frombuffer(self.layout, dtype=np.intc)[S:]
            buf = np.frombuffer(self.buf, dtype=np.float64)
            buf.setflags(write=False)
            self._view = StageArrays(dev, buf[:3 * S].reshape(S, 3), *(buf[j * S:(j + 1) * S] for j in (3, 4, 5, 6)),
                                     buf[7 * S:7 * S + D], D, self.tables.contention)
        return self._view


def _list_schedule_py(arr: StageArrays, M: int, policy: ListPolicy, limits: np.ndarray) -> ListResult:
    """The C engine's algorithm in Python (fallback and test oracle); `limits` as int32."""
    S, D = arr.n_stages, arr.n_devices
    split_backward, kind_rank, w_pressure = policy.split_backward, policy.kind_rank, policy.w_pressure
    f_tiebreak, b_tiebreak = policy.f_tiebreak, policy.b_tiebreak
    dev = [int(d) for d in arr.dev]
    dur = arr.dur.tolist()
    comm_f, comm_b = arr.comm_f.tolist(), arr.comm_b.tolist()
    act, free_i, cap = arr.act.tolist(), arr.free_i.tolist(), arr.cap.tolist()
    lim = limits.tolist()
    end = np.full((S, 3, M), -1.0)
    start = np.full((S, 3, M), -1.0)
    arr_f = np.full((S, M), -1.0)       # when F(s, m)'s activations reach stage s + 1
    arr_b = np.full((S, M), -1.0)       # when I(s, m)'s gradient reaches stage s - 1
    link_free: dict[tuple[int, int], float] | None = {} if arr.contention else None

    def arrival(t: float, c: float, a: int, b: int) -> float:
        if link_free is None or a == b:
            return t + c
        s0 = max(link_free.get((a, b), 0.0), t)
        link_free[(a, b)] = s0 + c
        return s0 + c
    nxt = [[0, 0, 0] for _ in range(S)]
    inflight = [0] * S
    free_t = [0.0] * D
    mem = [0.0] * D
    peak = np.zeros(D)
    dstages = [[s for s in range(S) if dev[s] == d] for d in range(D)]
    kinds = 3 if split_backward else 2
    total = S * M * kinds
    order: list[int] = []
    makespan = 0.0

    def ready(s: int, k: int, m: int) -> float:
        if k == 0:
            return 0.0 if s == 0 else arr_f[s - 1, m]
        if k == 1:
            e = end[s, 0, m]
            if e < 0:
                return -1.0
            r = e
            if s + 1 < S:
                e2 = arr_b[s + 1, m]
                if e2 < 0:
                    return -1.0
                r = max(r, e2)
            return r
        return end[s, 1, m]

    def best(d: int):
        pick = None
        pressured = cap[d] >= 0 and mem[d] > w_pressure * cap[d]
        for s in dstages[d]:
            for k in range(kinds):
                m = nxt[s][k]
                if m >= M:
                    continue
                r = ready(s, k, m)
                if r < 0:
                    continue
                if k == 0:
                    if lim[s] > 0 and inflight[s] >= lim[s]:
                        continue
                    if cap[d] >= 0 and mem[d] + act[s] > cap[d] * (1 + 1e-9) + 1e-12:
                        continue
                est = max(r, free_t[d])
                rank = -1 if (k == 2 and pressured) else kind_rank[k]
                if k == 0:
                    key = (rank, m, s) if f_tiebreak == 0 else (rank, -s, m)
                else:
                    key = (rank, -s, m) if b_tiebreak == 0 else (rank, m, -s)
                if pick is None:
                    pick = (est, key, s, k, m)
                    continue
                tol = 1e-12 * (abs(est) + 1.0)
                if est < pick[0] - tol or (abs(est - pick[0]) <= tol and key < pick[1]):
                    pick = (est, key, s, k, m)
        return pick

    while len(order) < total:
        cands = [(best(d), d) for d in range(D)]
        bd, choice = None, None
        for c, d in cands:
            if c is not None and (choice is None or c[0] < choice[0]):
                bd, choice = d, c
        if choice is None:
            break
        t0, _, s, k, m = choice
        t1 = t0 + dur[s][k]
        start[s, k, m] = t0
        end[s, k, m] = t1
        order.append((s * 3 + k) * M + m)
        nxt[s][k] += 1
        free_t[bd] = t1
        makespan = max(makespan, t1)
        if k == 0 and s + 1 < S:
            arr_f[s, m] = arrival(t1, comm_f[s], dev[s], dev[s + 1])
        elif k == 1 and s > 0:
            arr_b[s, m] = arrival(t1, comm_b[s], dev[s], dev[s - 1])
        if k == 0:
            inflight[s] += 1
            mem[bd] += act[s]
            peak[bd] = max(peak[bd], mem[bd])
        elif k == 1:
            inflight[s] -= 1
            mem[bd] -= free_i[s] if split_backward else act[s]
        else:
            mem[bd] -= act[s] - free_i[s]
    complete = len(order) == total
    return ListResult(makespan if complete else math.inf, start, np.asarray(order, dtype=np.int32),
                      peak, complete)
