"""A point in the tuner's search space, and the problem it is evaluated on.

A `Candidate` fixes the three levers: partition (layers per stage), placement (stage → device)
and a scheduling policy (split backward or not, in-flight limits, priority order). The policy is
run by the list scheduler and frozen into a table, the way the published tuner's schedule is
the trace of its simulator's policy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from octopipe.cluster import Cluster
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.plan import partition_from_sizes
from octopipe.tune.listsched import ListResult, StageArrays, list_schedule

INF_LIMIT = math.inf

# Priority orders of (F, I, W) ranks, lower first: backward first with W deferred into bubbles
# (zero-bubble style), backward then W before new forwards (1F1B-like), forward first.
KIND_RANKS: tuple[tuple[int, int, int], ...] = ((1, 0, 2), (2, 0, 1), (0, 1, 2))


@dataclass(frozen=True)
class Candidate:
    """Partition sizes, placement and policy; hashable, so evaluations are cached."""

    sizes: tuple[int, ...]
    placement: tuple[int, ...]
    split: bool = True
    inflight: float = 1.0              # limit[s] = max(1, round(inflight * (S - s) / chunks))
    kind_rank: tuple[int, int, int] = (1, 0, 2)
    f_tiebreak: int = 0                # 0: lowest micro-batch first; 1: deepest stage first
    b_tiebreak: int = 0                # 0: deepest stage first; 1: lowest micro-batch first
    w_pressure: float = 0.9            # run W first above this fraction of activation capacity
    origin: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", tuple(int(x) for x in self.sizes))
        object.__setattr__(self, "placement", tuple(int(x) for x in self.placement))
        if len(self.sizes) != len(self.placement):
            raise ConfigError(f"candidate has {len(self.sizes)} stage sizes but {len(self.placement)} "
                              "placed stages")

    @property
    def n_stages(self) -> int:
        return len(self.sizes)

    @property
    def partition(self) -> tuple[tuple[int, int], ...]:
        return partition_from_sizes(self.sizes)

    def limits(self, n_devices: int) -> np.ndarray:
        S = self.n_stages
        if math.isinf(self.inflight):
            return np.zeros(S, dtype=np.int32)
        chunks = S / max(1, len(set(self.placement)))
        base = (S - np.arange(S)) / chunks
        return np.maximum(1, np.round(self.inflight * base)).astype(np.int32)

    def with_(self, **kw) -> "Candidate":
        return replace(self, **kw)

    def describe(self) -> str:
        chunks = self.n_stages / max(1, len(set(self.placement)))
        pol = "zero-bubble split backward" if self.split else "full backward"
        lim = "memory-bound" if math.isinf(self.inflight) else f"in-flight x{self.inflight:g}"
        return f"{self.n_stages} stages ({chunks:g}/device), {pol}, {lim}"


@dataclass(frozen=True, eq=False)
class Problem:
    """The instance a tuner works on: costs on a cluster of `n_devices`, `n_microbatches`."""

    costs: CostTable
    cluster: Cluster
    n_microbatches: int
    memory_bytes: np.ndarray          # [D] device capacity
    kind_col: np.ndarray              # [D] CostTable column of each device
    semantics: str = "eager"

    @classmethod
    def build(cls, costs: CostTable, cluster: Cluster, n_devices: int, n_microbatches: int,
              semantics: str = "eager") -> "Problem":
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
        return cls(costs, cl, int(n_microbatches), mem, np.array(cols, dtype=np.int64), semantics)

    @property
    def n_devices(self) -> int:
        return self.cluster.n_devices

    @property
    def n_layers(self) -> int:
        return self.costs.n_layers

    def layer_work(self) -> np.ndarray:
        """[L, D] seconds of F+I+W of each layer on each device, per micro-batch."""
        c = self.costs
        return (c.f + c.i + c.w)[:, self.kind_col]

    def lower_bound(self) -> float:
        """Total work over the devices: no bubbles, no exposed transfers, perfect balance.

        With mixed device kinds each layer is charged at its fastest kind and the work is
        shared in proportion to device speed, which keeps the bound valid.
        """
        work = self.layer_work()
        speed = work.sum(axis=0)
        per_dev_rate = speed.min() / speed           # relative throughput of each device
        fastest = work.min(axis=1).sum()
        return float(self.n_microbatches * fastest / per_dev_rate.sum())

    def layer_bound(self) -> float:
        """A tighter bound for coarse models: layers are never split, so the device holding
        layer l cannot start it before micro-batch 0's forward has crossed every earlier layer,
        and then owes all of layer l's work: max_l (sum_{j<l} f_j + M * work_l). Its weight
        gradients may wait, but after its last input gradient that micro-batch still needs the
        input gradients of every earlier layer and layer 0's weight gradient:
        sum_{j<l} f_j + M * (f_l + i_l) + sum_{j<l} i_j + w_0 (l >= 1). Never below
        `lower_bound`."""
        c = self.costs
        f = c.f[:, self.kind_col].min(axis=1)
        i = c.i[:, self.kind_col].min(axis=1)
        w0 = float(c.w[0, self.kind_col].min())
        work = self.layer_work().min(axis=1)
        M = self.n_microbatches
        before = np.concatenate([[0.0], np.cumsum(f)[:-1]])
        chain = np.concatenate([[0.0], np.cumsum(i)[:-1] + w0])
        fill = before + M * work
        drain = before + M * np.minimum(f + i, work) + chain
        return max(self.lower_bound(), float(fill.max()), float(drain.max()))

    def _prefix(self) -> dict[str, np.ndarray]:
        pre = self.__dict__.get("_pre")
        if pre is None:
            c = self.costs
            pre = {name: np.vstack([np.zeros((1, arr.shape[1])), np.cumsum(arr, axis=0)])
                   for name, arr in (("f", c.f), ("i", c.i), ("w", c.w))}
            for name in ("act_bytes", "w_act_bytes", "static_bytes"):
                pre[name] = np.concatenate([[0.0], np.cumsum(getattr(c, name))])
            pre["out"] = np.asarray(c.out_bytes, dtype=np.float64)
            object.__setattr__(self, "_pre", pre)
        return pre

    def arrays(self, cand: Candidate) -> StageArrays:
        pre = self._prefix()
        dev = np.asarray(cand.placement, dtype=np.int32)
        b = np.concatenate([[0], np.cumsum(cand.sizes)])
        lo, hi = b[:-1], b[1:]
        col = self.kind_col[dev]
        f = pre["f"][hi, col] - pre["f"][lo, col]
        i = pre["i"][hi, col] - pre["i"][lo, col]
        w = pre["w"][hi, col] - pre["w"][lo, col]
        dur = np.stack([f, i, w], axis=1) if cand.split else np.stack([f, i + w, np.zeros_like(f)], axis=1)
        act = pre["act_bytes"][hi] - pre["act_bytes"][lo]
        wact = pre["w_act_bytes"][hi] - pre["w_act_bytes"][lo]
        static = np.bincount(dev, weights=pre["static_bytes"][hi] - pre["static_bytes"][lo],
                             minlength=self.n_devices)
        S = len(dev)
        comm_f = np.zeros(S)
        comm_b = np.zeros(S)
        for s in np.flatnonzero(dev[:-1] != dev[1:]):
            t = self.cluster.transfer_time(int(dev[s]), int(dev[s + 1]), float(pre["out"][hi[s] - 1]))
            comm_f[s] = t
            comm_b[s + 1] = t
        cap = self.memory_bytes - static
        free_i = act - wact if cand.split else act
        return StageArrays(dev, dur, comm_f, comm_b, act, free_i, cap, self.n_devices)

    def static_bytes(self, cand: Candidate) -> np.ndarray:
        out = np.zeros(self.n_devices)
        for (lo, hi), d in zip(cand.partition, cand.placement):
            out[d] += self.costs.range_sum("static_bytes", lo, hi)
        return out

    def device_load(self, cand: Candidate) -> np.ndarray:
        """[D] seconds of compute per micro-batch on each device (the static balance)."""
        work = self.layer_work()
        pref = np.vstack([np.zeros((1, work.shape[1])), np.cumsum(work, axis=0)])
        load = np.zeros(self.n_devices)
        for (lo, hi), d in zip(cand.partition, cand.placement):
            load[d] += pref[hi, d] - pref[lo, d]
        return load

    def estimate(self, cand: Candidate) -> ListResult:
        """Run the candidate's policy through the list scheduler (the cheap estimate)."""
        arr = self.arrays(cand)
        if (arr.cap < 0).any():
            S, M = arr.n_stages, self.n_microbatches
            return ListResult(math.inf, np.full((S, 3, M), -1.0), np.zeros(0, np.int32),
                              np.zeros(self.n_devices), False)
        return list_schedule(arr, self.n_microbatches, split=cand.split,
                             limits=cand.limits(self.n_devices), kind_rank=cand.kind_rank,
                             f_tiebreak=cand.f_tiebreak, b_tiebreak=cand.b_tiebreak,
                             w_pressure=cand.w_pressure)
