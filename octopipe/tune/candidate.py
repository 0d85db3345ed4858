"""A point in the tuner's search space, and the problem it is evaluated on.

A `Candidate` fixes the three levers: partition (layers per stage), placement (stage → device)
and a scheduling policy (split backward or not, in-flight limits, priority order). The policy is
run by the list scheduler and frozen into a table, the way the OctoPipe authors' tuner's schedule is
the trace of its simulator's policy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np

from octopipe.cluster import Cluster
from octopipe.cost.stage_costs import StageCosts
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.plan import Partition
from octopipe.tune.listsched import (
    ListPolicy,
    ListResult,
    PackedPolicy,
    PackedStages,
    StageArrays,
    StageTables,
    c_kernel_available,
    list_makespan,
    list_schedule,
    pack_policy,
    stage_tables,
)

INF_LIMIT = math.inf
ARRAYS_CACHE = 4096        # distinct layouts whose estimator arrays a problem keeps
_CONVERTED = frozenset({"partition", "placement", "warmup"})   # the fields `Candidate.__post_init__` converts

# Priority orders of (F, I, W) ranks, lower first: backward first with W deferred into bubbles
# (zero-bubble style), backward then W before new forwards (1F1B-like), forward first.
KIND_RANKS: tuple[tuple[int, int, int], ...] = ((1, 0, 2), (2, 0, 1), (0, 1, 2))


@dataclass(frozen=True)
class Candidate:
    """Partition, placement and policy; hashable, so evaluations are cached."""

    partition: Partition               # layer sizes given as a sequence of ints become one
    placement: tuple[int, ...]
    split_backward: bool = True
    inflight: float = 1.0              # limit[s] = max(1, round(inflight * (S - s) / chunks))
    kind_rank: tuple[int, int, int] = (1, 0, 2)
    f_tiebreak: int = 0                # 0: lowest micro-batch first; 1: deepest stage first
    b_tiebreak: int = 0                # 0: deepest stage first; 1: lowest micro-batch first
    w_pressure: float = 0.9            # run W first above this fraction of activation capacity
    warmup: tuple[int, ...] = ()       # per-stage offsets to the limits (a memory-budget move)
    origin: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.partition, Partition):
            object.__setattr__(self, "partition", Partition(tuple(self.partition)))
        object.__setattr__(self, "placement", tuple(map(int, self.placement)))
        object.__setattr__(self, "warmup", tuple(map(int, self.warmup)))
        if len(self.partition) != len(self.placement):
            raise ConfigError(f"candidate has {len(self.partition)} stage sizes but {len(self.placement)} "
                              "placed stages")

    @property
    def sizes(self) -> tuple[int, ...]:
        return self.partition.sizes

    @property
    def n_stages(self) -> int:
        return len(self.placement)

    def limits(self, n_devices: int) -> np.ndarray:
        S = self.n_stages
        if math.isinf(self.inflight):
            return np.zeros(S, dtype=np.int32)
        chunks = S / max(1, len(set(self.placement)))
        base = (S - np.arange(S)) / chunks
        lim = np.round(self.inflight * base)
        if len(self.warmup) == S:
            lim = lim + np.asarray(self.warmup)
        return np.maximum(1, lim).astype(np.int32)

    def list_policy(self, n_devices: int) -> ListPolicy:
        """The candidate's policy as the list scheduler takes it."""
        return ListPolicy(self.split_backward, self.limits(n_devices), self.kind_rank, self.f_tiebreak,
                          self.b_tiebreak, self.w_pressure)

    def __hash__(self) -> int:
        """The dataclass hash (of the compared fields), computed once: the search looks each
        candidate up in several caches."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash((self.partition, self.placement, self.split_backward,
                                               self.inflight, self.kind_rank, self.f_tiebreak,
                                               self.b_tiebreak, self.w_pressure, self.warmup))
        return h

    def with_(self, **kw) -> Candidate:
        """A copy with `kw` changed, as `replace` makes it. The search makes tens of thousands:
        this copies the fields instead of re-running `__init__`, and converts and checks them
        (`__post_init__`) only when a field that needs it changes."""
        unknown = kw.keys() - _FIELDS
        if unknown:
            raise TypeError(f"Candidate has no field(s) {sorted(unknown)}")
        new = object.__new__(Candidate)
        d = new.__dict__
        d.update(self.__dict__)
        d.pop("_hash", None)
        d.update(kw)
        if not _CONVERTED.isdisjoint(kw):
            new.__post_init__()
        return new

    def describe(self) -> str:
        chunks = self.n_stages / max(1, len(set(self.placement)))
        pol = "zero-bubble split backward" if self.split_backward else "full backward"
        lim = "memory-bound" if math.isinf(self.inflight) else f"in-flight x{self.inflight:g}"
        if any(self.warmup) and not math.isinf(self.inflight):
            lim += f" {'/'.join(f'{x:+d}' for x in self.warmup)}"
        return f"{self.n_stages} stages ({chunks:g}/device), {pol}, {lim}"


_FIELDS = frozenset(f.name for f in fields(Candidate))


@dataclass(frozen=True, eq=False)
class Problem:
    """The instance a tuner works on: costs on a cluster of `n_devices`, `n_microbatches`."""

    costs: CostTable
    cluster: Cluster
    n_microbatches: int
    memory_bytes: np.ndarray          # [D] device capacity
    kind_col: np.ndarray              # [D] CostTable column of each device
    semantics: str = "eager"
    act_budget: np.ndarray | None = None   # [D] activation bytes a plan may hold (tuner.memory_budget)
    contention: bool = False  # the estimator's links carry one transfer at a time (tuner.link_contention)

    @classmethod
    def build(cls, costs: CostTable, cluster: Cluster, n_devices: int, n_microbatches: int,
              semantics: str = "eager", act_budget: np.ndarray | None = None,
              contention: bool = False) -> Problem:
        if n_devices < 1:
            raise ConfigError(f"pp={n_devices}: a pipeline needs at least one device")
        if n_microbatches < 1:
            raise ConfigError(f"microbatches={n_microbatches}: choose at least 1")
        if costs.n_layers < n_devices:
            raise ConfigError(f"pp={n_devices} exceeds the model's {costs.n_layers} layers; "
                              "choose a smaller pp")
        cl = cluster.restrict(n_devices) if cluster.n_devices != n_devices else cluster
        cols = costs.columns_for(cl)
        mem = np.array([cl.kind_of(d).memory_bytes for d in range(n_devices)], dtype=np.float64)
        budget = None if act_budget is None else np.broadcast_to(
            np.asarray(act_budget, dtype=np.float64), (n_devices,)).copy()
        return cls(costs, cl, int(n_microbatches), mem, np.array(cols, dtype=np.int64), semantics,
                   budget, bool(contention))

    def over_memory(self, peak_memory: np.ndarray, peak_activation: np.ndarray) -> list[str]:
        """Why a simulated plan does not fit, one phrase per device over its capacity or its
        activation budget (empty when it fits)."""
        out = []
        for d in np.flatnonzero(np.asarray(peak_memory) > self.memory_bytes * (1 + 1e-9)):
            out.append(f"out of memory on device {d}: {peak_memory[d] / 2**30:.1f} GiB > "
                       f"{self.memory_bytes[d] / 2**30:.1f} GiB")
        if self.act_budget is not None:
            for d in np.flatnonzero(np.asarray(peak_activation) > self.act_budget * (1 + 1e-9)):
                out.append(f"over the activation budget on device {d}: "
                           f"{peak_activation[d] / 2**30:.3f} GiB > {self.act_budget[d] / 2**30:.3f} GiB")
        return out

    @property
    def n_devices(self) -> int:
        return self.cluster.n_devices

    @property
    def n_layers(self) -> int:
        return self.costs.n_layers

    def layer_work(self) -> np.ndarray:
        """[L, D] seconds of each layer's work per micro-batch on each device (read-only): F and
        the cheaper backward, I + W or a full B where the table measured one."""
        work = self.__dict__.get("_work")
        if work is None:
            c = self.costs
            work = (c.work if c.full_b is None else c.f + np.minimum(c.i + c.w, c.b))[:, self.kind_col]
            work.setflags(write=False)
            object.__setattr__(self, "_work", work)
        return work

    def stages(self, cand: Candidate) -> StageCosts:
        """The candidate's per-stage costs, each stage on its device's kind."""
        return StageCosts.bind(self.costs, cand.partition, cand.placement, self.kind_col)

    def arrays(self, cand: Candidate) -> StageArrays:
        """What the list scheduler needs: durations (I + W as B without split backward), boundary
        delays, activation bytes and each device's capacity left after its static bytes. Cached
        per partition, placement and backward split (the policy does not change them), read-only."""
        got = self._layout(cand)
        return got if isinstance(got, StageArrays) else got.arrays()

    def _layout(self, cand: Candidate) -> PackedStages | StageArrays:
        """`arrays`' numbers, cached: packed for the C engine, else as numpy arrays."""
        cache = self.__dict__.get("_arrays_cache")
        if cache is None:
            cache = {}
            object.__setattr__(self, "_arrays_cache", cache)
        key = (cand.partition, cand.placement, cand.split_backward)
        got = cache.get(key)
        if got is None:
            if len(cache) >= ARRAYS_CACHE:
                cache.clear()
            got = cache[key] = (PackedStages(self._tables(), cand.partition.sizes, cand.placement,
                                             cand.split_backward) if c_kernel_available()
                                else self._arrays_numpy(cand))
        return got

    def _tables(self) -> StageTables:
        """The prefix sums, link matrices and capacities as the C engine reads them (built once)."""
        got = self.__dict__.get("_c_tables")
        if got is None:
            got = stage_tables(self.kind_col, self._prefixes(), self.costs.out_bytes, self._link_matrices(),
                               self.memory_bytes, self.act_budget, self.contention, self._backward())
            object.__setattr__(self, "_c_tables", got)
        return got

    def _arrays_numpy(self, cand: Candidate) -> StageArrays:
        """`arrays` uncached, with numpy (the fallback without a C compiler, and the oracle of
        listsched.c's `octo_stage_arrays`): every figure a difference of the cost table's prefix
        sums, as in `StageCosts.bind` (the same subtractions, so the same bits), in one buffer
        whose C addresses are kept with it."""
        pfiw, p1 = self._prefixes()
        has_b, h = self._backward()
        D, S = self.n_devices, cand.n_stages
        b = cand.partition.bounds
        lo, hi = b[:-1], b[1:]
        place = np.array(cand.placement, dtype=np.int64)
        col = self.kind_col[place]
        fiwb = (pfiw[hi, col] - pfiw[lo, col]) + h       # [S, 4] F, I, W, B
        fiw = fiwb[:, :3]
        byt = p1[hi] - p1[lo]                            # [S, 3] act, w_act, static bytes
        buf = np.empty(7 * S + D)
        dur = buf[:3 * S].reshape(S, 3)
        comm_f, comm_b, act, free_i = (buf[(3 + j) * S:(4 + j) * S] for j in range(4))
        cap = buf[7 * S:]
        if cand.split_backward:
            dur[:] = fiw
            np.subtract(byt[:, 0], byt[:, 1], out=free_i)
        else:
            dur[:, 0] = fiw[:, 0]
            dur[:, 1] = fiwb[:, 3] if has_b else fiw[:, 1] + fiw[:, 2]
            dur[:, 2] = 0.0
            free_i[:] = byt[:, 0]
        act[:] = byt[:, 0]
        dev = place.astype(np.int32)
        t = self._transfers(dev, self.costs.out_bytes[hi - 1])
        comm_f[:-1], comm_f[-1] = t, 0.0
        comm_b[0], comm_b[1:] = 0.0, t
        np.subtract(self.memory_bytes, np.bincount(place, weights=byt[:, 2], minlength=D), out=cap)
        if self.act_budget is not None:
            np.minimum(cap, self.act_budget, out=cap)
        buf.setflags(write=False)
        dev.setflags(write=False)
        arr = StageArrays(dev, dur, comm_f, comm_b, act, free_i, cap, D, self.contention)
        base = buf.__array_interface__["data"][0]
        object.__setattr__(arr, "_ptrs", ([dev.__array_interface__["data"][0], base,
                                           *(base + 8 * S * j for j in (3, 4, 5, 6, 7))], (dev, buf)))
        return arr

    def _backward(self) -> tuple[bool, float]:
        """(`CostTable.own_b`, the host seconds each action adds): as `StageCosts.bind`."""
        return self.costs.own_b, float(self.costs.action_s)

    def _prefixes(self) -> tuple[np.ndarray, np.ndarray]:
        """The cost table's prefix sums stacked: [L + 1, kinds, 4] of F, I, W, B and [L + 1, 3] of
        act, w_act and static bytes (copies of `CostTable.prefix`'s, read-only)."""
        got = self.__dict__.get("_pre")
        if got is None:
            c = self.costs
            got = (np.stack([c.prefix(n) for n in ("f", "i", "w", "b")], axis=-1),
                   np.stack([c.prefix(n) for n in ("act_bytes", "w_act_bytes", "static_bytes")], axis=-1))
            for a in got:
                a.setflags(write=False)
            object.__setattr__(self, "_pre", got)
        return got

    def _link_matrices(self) -> tuple[np.ndarray, np.ndarray]:
        """[D, D] latency and bandwidth of the link between each device pair (0 and inf where
        there is none), built once."""
        links = self.__dict__.get("_links")
        if links is None:
            D, cl = self.n_devices, self.cluster
            lat, bw = np.zeros((D, D)), np.full((D, D), np.inf)
            for a in range(D):
                for b in range(D):
                    link = cl.link(a, b)
                    if link is not None:
                        lat[a, b], bw[a, b] = link.latency, link.bandwidth
            links = (lat, bw)
            for x in links:
                x.setflags(write=False)
            object.__setattr__(self, "_links", links)
        return links

    def _transfers(self, dev: np.ndarray, out_bytes: np.ndarray) -> np.ndarray:
        """[S - 1] seconds across each stage boundary, as `StageCosts.boundary_transfers` (0 on
        one device, else the link's latency + bytes / bandwidth), from cached link matrices."""
        lat, bw = self._link_matrices()
        a, b = dev[:-1], dev[1:]
        return np.where(a == b, 0.0, lat[a, b] + out_bytes[:-1] / bw[a, b])

    def device_load(self, cand: Candidate) -> np.ndarray:
        """[D] seconds of compute per micro-batch on each device (the static balance)."""
        st = self.stages(cand)
        return st.per_device(st.work, self.n_devices)

    def estimate(self, cand: Candidate) -> ListResult:
        """Run the candidate's policy through the list scheduler (the cheap estimate)."""
        arr = self.arrays(cand)
        if (arr.cap < 0).any():
            S, M = arr.n_stages, self.n_microbatches
            return ListResult(math.inf, np.full((S, 3, M), -1.0), np.zeros(0, np.int32),
                              np.zeros(self.n_devices), False)
        return list_schedule(arr, self.n_microbatches, cand.list_policy(self.n_devices))

    def estimate_makespan(self, cand: Candidate, bound: float = math.inf) -> float:
        """`estimate(cand).makespan` alone, or NaN when it provably exceeds `bound` (the estimate
        stopped early: see `list_makespan`)."""
        got = self._layout(cand)
        if isinstance(got, StageArrays):
            if (got.cap < 0).any():
                return math.inf
            return list_makespan(got, self.n_microbatches, cand.list_policy(self.n_devices), bound)
        return got.estimate(self.n_microbatches, self._policy(cand), bound)

    def _policy(self, cand: Candidate) -> PackedPolicy:
        """The candidate's policy packed for the C engine, cached per what it depends on."""
        cache = self.__dict__.get("_policies")
        if cache is None:
            cache = {}
            object.__setattr__(self, "_policies", cache)
        key = (cand.split_backward, cand.inflight, cand.kind_rank, cand.f_tiebreak, cand.b_tiebreak,
               cand.w_pressure, cand.warmup, len(cand.placement), len(set(cand.placement)))
        got = cache.get(key)
        if got is None:
            if len(cache) >= ARRAYS_CACHE:
                cache.clear()
            got = cache[key] = pack_policy(cand.list_policy(self.n_devices))
        return got
