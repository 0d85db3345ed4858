"""SimResult: what one simulation produced, with the derived figures users and the tuner read.

Bubble causes split every idle second of a device into one of `CAUSES`:

- ``warmup_cooldown``: before the device's first compute and after its last one;
- ``wait_upstream`` / ``wait_downstream``: the next compute waits for its input, and the
  producer on another device (an earlier stage for F, a later one for I/B) has not finished;
- ``wait_transfer``: the producer has finished but the message is still queued on or crossing
  the link, or (strict) the device is held by its communication cells (a rendezvous SEND, a
  batched group, a RECV placed early);
- ``memory``: (ready_first) a ready F is held back by the in-flight or memory limit.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cached_property

import numpy as np

from octopipe.schedule.table import ScheduleTable
from octopipe.sim.durations import Durations
from octopipe.sim.program import FWD, Program


class BubbleCause(str, Enum):
    """Why a device idles: the project's one vocabulary of bubble causes (see the module
    docstring); the columns of `SimResult.bubble_causes`, in this order."""

    WARMUP_COOLDOWN = "warmup_cooldown"
    WAIT_UPSTREAM = "wait_upstream"
    WAIT_DOWNSTREAM = "wait_downstream"
    WAIT_TRANSFER = "wait_transfer"
    MEMORY = "memory"

    @property
    def column(self) -> int:
        return CAUSES.index(self.value)


CAUSES = tuple(c.value for c in BubbleCause)
# the waits the pipeline's data dependencies cause: filling and draining it, and producers on
# other devices still computing
DEPENDENCY = (BubbleCause.WARMUP_COOLDOWN, BubbleCause.WAIT_UPSTREAM, BubbleCause.WAIT_DOWNSTREAM)


@dataclass(frozen=True, eq=False)
class SimResult:
    """Start/end of every compute node (`start`, `end`) and transfer; ids as in `Program`."""

    program: Program = field(repr=False)
    durations: Durations = field(repr=False)
    policy: str
    semantics: str
    start: np.ndarray
    end: np.ndarray
    transfer_start: np.ndarray
    transfer_end: np.ndarray
    order: tuple[np.ndarray, ...]
    makespan: float
    busy: np.ndarray                   # [device] seconds of compute
    peak_activation_memory: np.ndarray  # [device] bytes
    memory_blocked: np.ndarray         # [device] seconds idle with an F held by a limit
    grad_sync_start: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [stage] DP sync
    grad_sync_end: np.ndarray = field(default_factory=lambda: np.zeros(0))    # (empty: dp = 1)

    @property
    def n_devices(self) -> int:
        return self.program.n_devices

    @property
    def idle(self) -> np.ndarray:
        return self.makespan - self.busy

    @property
    def device_bubble_ratio(self) -> np.ndarray:
        return self.idle / self.makespan if self.makespan > 0 else np.zeros(self.n_devices)

    @property
    def bubble_ratio(self) -> float:
        """Idle share of all device-seconds: 1 - sum(busy) / (devices x makespan)."""
        if self.makespan <= 0:
            return 0.0
        return float(1.0 - self.busy.sum() / (self.n_devices * self.makespan))

    @property
    def static_memory(self) -> np.ndarray:
        return self.durations.static

    @property
    def peak_memory(self) -> np.ndarray:
        """[device] bytes: static (parameters, gradients, optimizer) + activation peak."""
        return self.durations.static + self.peak_activation_memory

    def memory_trace(self, device: int) -> tuple[np.ndarray, np.ndarray]:
        """(times, activation bytes held just after each) on `device`: F allocates when it starts,
        I, W and B free when they end (zero-bubble's model, `octopipe.sim.durations`); at equal
        times frees come first, as in the engine, so the trace's maximum is the device's peak."""
        ids = np.flatnonzero(self.program.c_dev == device)
        du = self.durations
        t = np.concatenate([self.start[ids], self.end[ids]])
        delta = np.concatenate([du.alloc[ids], -du.free[ids]])
        first = np.concatenate([np.ones(len(ids)), np.zeros(len(ids))])   # frees (0) first
        order = np.lexsort((first, t))
        return t[order], np.cumsum(delta[order])

    @property
    def over_capacity(self) -> tuple[int, ...]:
        return tuple(int(d) for d in np.nonzero(self.peak_memory > self.durations.capacity)[0])

    @property
    def throughput_tokens_per_s(self) -> float:
        return self.durations.tokens / self.makespan if self.makespan > 0 else 0.0

    @property
    def mfu(self) -> float:
        """Model FLOPs (3 x forward per iteration) over makespan x the devices' peak FLOP/s."""
        peak = float(self.durations.peak_flops.sum())
        if peak <= 0 or self.makespan <= 0:
            return 0.0
        return self.durations.train_flops / (self.makespan * peak)

    @cached_property
    def bubble_causes(self) -> np.ndarray:
        """[device, cause] idle seconds, causes in `CAUSES` order; rows sum to `idle`."""
        P = self.program
        out = np.zeros((self.n_devices, len(CAUSES)))
        lp_end = np.zeros(P.n_compute)
        if len(P.lp_idx):
            owner = np.repeat(np.arange(P.n_compute), np.diff(P.lp_ptr))
            np.maximum.at(lp_end, owner, self.end[P.lp_idx])
        in_t = P.c_in_transfer
        has_in = in_t >= 0
        arrival = np.where(has_in, self.transfer_end[np.maximum(in_t, 0)] if P.n_transfers else 0.0, 0.0)
        prod_end = np.where(has_in, self.end[P.t_producer[np.maximum(in_t, 0)]] if P.n_transfers else 0.0, 0.0)
        fwd_in = np.where(has_in, (P.t_dir[np.maximum(in_t, 0)] == FWD) if P.n_transfers else False, False)
        ready = np.maximum(lp_end, arrival)
        for d, ids in enumerate(self.order):
            if len(ids) == 0:
                out[d, 0] = self.makespan
                continue
            s, e = self.start[ids], self.end[ids]
            out[d, 0] = s[0] + (self.makespan - e[-1])
            x = ids[1:]
            g0, g1 = e[:-1], s[1:]
            r = np.minimum(ready[x], g1)
            wait_in = np.clip(r - g0, 0.0, None)
            via_t = has_in[x] & (arrival[x] >= lp_end[x])
            producer = np.where(via_t, np.clip(np.minimum(prod_end[x], g1) - g0, 0.0, None), 0.0)
            producer = np.minimum(producer, wait_in)
            up = np.where(fwd_in[x], producer, 0.0)
            out[d, 1] = up.sum()
            out[d, 2] = (producer - up).sum()
            held = np.clip(g1 - np.maximum(g0, r), 0.0, None)
            transfer = (wait_in - producer).sum()
            if self.policy == "ready_first":
                out[d, 3] = transfer
                out[d, 4] = held.sum()
                moved = max(0.0, min(float(self.memory_blocked[d]), out[d, 1:4].sum()) - out[d, 4])
                for col in (2, 1, 3):   # idle while an F was held back: the limit's doing
                    take = min(moved, out[d, col])
                    out[d, col] -= take
                    out[d, 4] += take
                    moved -= take
            else:
                out[d, 3] = transfer + held.sum()
        return out

    def idle_for(self, cause: BubbleCause) -> np.ndarray:
        """[device] idle seconds of one cause."""
        return self.bubble_causes[:, cause.column].copy()

    @property
    def dependency_wait(self) -> np.ndarray:
        """[device] idle seconds of the `DEPENDENCY` causes together."""
        bc = self.bubble_causes
        first, *rest = DEPENDENCY
        out = bc[:, first.column]
        for c in rest:
            out = out + bc[:, c.column]
        return out

    @cached_property
    def critical_path(self) -> tuple[int, ...]:
        """Node ids (compute c, transfer n_compute + t) of the chain that ends last.

        Walking back from the last node, each step goes to the predecessor (device order, data,
        incoming transfer, producer, previous transfer on the same link) that finished last.
        """
        P = self.program
        n_c = P.n_compute
        if n_c == 0:
            return ()
        prev_dev = np.full(n_c, -1)
        for ids in self.order:
            if len(ids) > 1:
                prev_dev[ids[1:]] = ids[:-1]
        prev_link = np.full(P.n_transfers, -1)
        for lk in range(len(P.links)):
            ts = np.nonzero(P.t_link == lk)[0]
            ts = ts[np.argsort(self.transfer_start[ts], kind="stable")]
            if len(ts) > 1:
                prev_link[ts[1:]] = ts[:-1]
        node = int(np.argmax(self.end))
        path = [node]
        while True:
            cands: list[tuple[float, int]] = []
            if node < n_c:
                t0 = self.start[node]
                if prev_dev[node] >= 0:
                    cands.append((self.end[prev_dev[node]], int(prev_dev[node])))
                for k in range(P.lp_ptr[node], P.lp_ptr[node + 1]):
                    y = int(P.lp_idx[k])
                    cands.append((self.end[y], y))
                t = int(P.c_in_transfer[node])
                if t >= 0:
                    cands.append((self.transfer_end[t], n_c + t))
            else:
                t = node - n_c
                t0 = self.transfer_start[t]
                p = int(P.t_producer[t])
                cands.append((self.end[p], p))
                if prev_link[t] >= 0:
                    cands.append((self.transfer_end[prev_link[t]], n_c + int(prev_link[t])))
            cands = [c for c in cands if c[0] <= t0 + 1e-12]
            if t0 <= 0 or not cands:
                break
            node = max(cands)[1]
            path.append(node)
        return tuple(reversed(path))

    def critical_path_labels(self) -> list[str]:
        return [self.program.node_label(n) for n in self.critical_path]

    def executed_table(self, name: str | None = None) -> ScheduleTable:
        """The compute order each device actually ran, as a table (ready_first → strict)."""
        P = self.program
        rows = [tuple(P.action(int(c)) for c in ids) for ids in self.order]
        t = P.table.compute_only().with_rows(rows)
        if name is not None:
            t = replace(t, name=name)
        return t

    def summary(self) -> dict:
        """Figures under the CLI's snake_case keys (units in the names)."""
        causes = self.bubble_causes.sum(axis=0)
        return {
            "policy": self.policy,
            "semantics": self.semantics,
            "makespan_s": float(self.makespan),
            "bubble_ratio": self.bubble_ratio,
            "device_bubble_ratio": [float(x) for x in self.device_bubble_ratio],
            "busy_s": [float(x) for x in self.busy],
            "bubble_causes_s": {c: float(v) for c, v in zip(CAUSES, causes)},
            "peak_memory_bytes": float(self.peak_memory.max()),
            "peak_activation_memory_bytes": float(self.peak_activation_memory.max()),
            "device_peak_memory_bytes": [float(x) for x in self.peak_memory],
            "static_memory_bytes": [float(x) for x in self.static_memory],
            "over_capacity_devices": list(self.over_capacity),
            "throughput_tokens_per_s": float(self.throughput_tokens_per_s),
            "mfu": float(self.mfu),
            "n_actions": int(self.program.n_compute),
            "n_transfers": int(self.program.n_transfers),
            "transfer_s": float((self.transfer_end - self.transfer_start).sum()),
            "critical_path_length": len(self.critical_path),
        }
