"""Data parallelism: `dp` replicas of the pipeline, each stage's gradients averaged over them.

Replica d of a step runs micro-batches d*m .. d*m + m - 1 (`ReplicaBatches`), so dp replicas of
m micro-batches train on the same global batch as one pipeline of dp*m. A stage's gradients are
final after its last B or W on the rank; `GradSync` then starts their average over the stage's
replicas at once (asynchronous collectives, in buckets), so the sync overlaps the rest of the
row as the simulator's gradient sync does, and waits for it at the end of the iteration. A group
per (stage, TP rank) keeps each collective's partners in step whatever order ready-first
dispatch finishes stages in.

ZeRO-1 (`zero`): each stage's parameters are dealt out whole to the replicas (the least-loaded
first); gradients are reduce-scattered so that each replica receives the average of the ones
it owns, its AdamW updates only those (its state is sharded), and `gather_params` all-gathers
the updated parameters. Whole parameters keep AdamW's per-parameter rules (decay of matrices
only) and checkpoint names unchanged.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from octopipe.runtime.rank_job import DataParallelSpec
from octopipe.runtime.tensor_parallel import Grid
from octopipe.schedule.action import Action, ActionKind
from octopipe.schedule.table import ScheduleTable


@dataclass(frozen=True)
class ReplicaBatches:
    """Replica `replica`'s share of the global batch: its micro-batch mb is the source's
    replica * m + mb."""

    source: object
    replica: int
    m: int

    def batch(self, iteration: int, mb: int) -> dict:
        return self.source.batch(iteration, self.replica * self.m + mb)


def owners(sizes: list[int], dp: int) -> list[int]:
    """The replica owning each parameter (by element count): each in turn to the least-loaded
    replica, the lowest index on a tie; deterministic, so every replica agrees."""
    load, out = [0] * dp, []
    for n in sizes:
        d = min(range(dp), key=lambda k: (load[k], k))
        out.append(d)
        load[d] += n
    return out


def buckets(sizes: list[int], elem_bytes: int, limit: int) -> list[list[int]]:
    """Parameter indices in buckets of at most `limit` bytes (a larger parameter alone), last
    parameters first: the order a backward finishes them."""
    out: list[list[int]] = []
    size = 0
    for k in reversed(range(len(sizes))):
        if out and size + sizes[k] * elem_bytes <= limit:
            out[-1].append(k)
            size += sizes[k] * elem_bytes
        else:
            out.append([k])
            size = sizes[k] * elem_bytes
    return out


def _grad(p: torch.Tensor) -> torch.Tensor:
    return (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)


class GradSync:
    """One rank's gradient averaging over its replicas, stage by stage as each stage's backward
    work on the rank ends (`done`), waited for in `finish`."""

    def __init__(self, copies: dict, row: tuple[Action, ...], grid: Grid, prank: int, spec: DataParallelSpec,
                 table: ScheduleTable) -> None:
        self.spec, self.dp = spec, grid.dp
        _, self.replica, t = grid.place(dist.get_rank())
        holder = {s: d for d in range(table.n_devices) for _, s in table.replica_stages_of(d)}
        groups = {(s, k): dist.new_group([grid.rank(holder[s], k, d) for d in range(grid.dp)])
                  for s in range(table.n_stages) for k in range(grid.tp)}
        self.group = {s: groups[(s, t)] for (_, s) in copies}
        self.params = {s: [p for p in mod.parameters() if p.requires_grad] for (_, s), mod in copies.items()}
        self.work = {s: sum(1 for a in row if a.stage == s and a.kind in (ActionKind.B, ActionKind.W))
                     for s in self.params}
        self.pending: list[tuple] = []
        self.left: dict[int, int] = {}
        self.keep_whole(set())

    def keep_whole(self, ids: set[int]) -> None:
        """Under ZeRO, keep the parameters `ids` whole on every replica (owner -1: averaged by an
        all-reduce and updated everywhere): a parameter shared by stages, whose copies' gradients
        are summed after the sync."""
        self.owner = {}
        for s, ps in self.params.items():
            dealt = iter(owners([p.numel() for p in ps if id(p) not in ids], self.dp))
            self.owner[s] = [-1 if id(p) in ids else next(dealt) for p in ps]

    def start_iteration(self) -> None:
        self.left, self.pending = dict(self.work), []
        self.started: dict[int, float] = {}     # stage -> when its sync started (perf_counter)
        self.wait_s = 0.0                       # the iteration's wait for syncs at its end: exposed

    def owned(self) -> set[int]:
        """Ids of the parameters whose AdamW state this replica holds (all of them without ZeRO)."""
        return {id(p) for s, ps in self.params.items() for p, o in zip(ps, self.owner[s])
                if not self.spec.zero or o in (-1, self.replica)}

    def counted_elsewhere(self) -> set[int]:
        """Ids of the parameters whose averaged gradient the first replica counts in a global
        norm (all of them, or under ZeRO the ones kept whole); on the first replica none."""
        if self.replica == 0:
            return set()
        return {id(p) for s, ps in self.params.items() for p, o in zip(ps, self.owner[s])
                if not self.spec.zero or o == -1}

    def done(self, a: Action) -> None:
        """After action `a`: start the stage's sync when it was the stage's last B or W."""
        if a.kind not in (ActionKind.B, ActionKind.W) or a.stage not in self.left:
            return
        self.left[a.stage] -= 1
        if self.left[a.stage] == 0 and self.params[a.stage]:
            self._start(a.stage)

    def _segments(self, s: int) -> tuple[list[list[int]], int]:
        """ZeRO: the parameter indices each replica owns, and the longest segment's elements."""
        seg = [[k for k, o in enumerate(self.owner[s]) if o == d] for d in range(self.dp)]
        ps = self.params[s]
        return seg, max(1, max(sum(ps[k].numel() for k in ks) for ks in seg))

    def _start(self, s: int) -> None:
        self.started[s] = time.perf_counter()
        ps, group = self.params[s], self.group[s]
        whole = [k for k, o in enumerate(self.owner[s]) if not self.spec.zero or o == -1]
        for bucket in buckets([ps[k].numel() for k in whole], ps[0].element_size(), self.spec.bucket_bytes):
            idx = [whole[k] for k in bucket]
            flat = torch.cat([_grad(ps[k]) for k in idx])
            self.pending.append((s, idx, flat, dist.all_reduce(flat, group=group, async_op=True)))
        if not self.spec.zero or len(whole) == len(ps):
            return
        seg, width = self._segments(s)
        parts = []
        for ks in seg:
            body = [_grad(ps[k]) for k in ks]
            used = sum(x.numel() for x in body)
            parts.append(torch.cat([*body, torch.zeros(width - used, dtype=ps[0].dtype)]))
        mine = torch.empty(width, dtype=ps[0].dtype)
        self.pending.append((s, seg[self.replica], mine,
                             dist.reduce_scatter_tensor(mine, torch.cat(parts), group=group, async_op=True)))

    def finish(self) -> None:
        """Wait for every sync; each gradient becomes the replicas' average (ZeRO: only the
        owned ones; the others are dropped)."""
        t0 = time.perf_counter()
        for s, idx, flat, work in self.pending:
            work.wait()
            flat.div_(self.dp)
            off = 0
            for k in idx:
                p = self.params[s][k]
                p.grad = flat[off:off + p.numel()].view_as(p).clone()
                off += p.numel()
            if self.spec.zero:
                for k, p in enumerate(self.params[s]):
                    if self.owner[s][k] not in (-1, self.replica):
                        p.grad = None
        self.pending = []
        self.wait_s = time.perf_counter() - t0

    @torch.no_grad()
    def gather_params(self) -> None:
        """ZeRO, after the update: every replica's parameters from their owners (all-gather)."""
        if not self.spec.zero:
            return
        for s in sorted(self.params):
            ps = self.params[s]
            if all(o == -1 for o in self.owner[s]):
                continue
            seg, width = self._segments(s)
            body = [ps[k].detach().reshape(-1) for k in seg[self.replica]]
            used = sum(x.numel() for x in body)
            mine = torch.cat([*body, torch.zeros(width - used, dtype=ps[0].dtype)])
            full = torch.empty(width * self.dp, dtype=ps[0].dtype)
            dist.all_gather_into_tensor(full, mine, group=self.group[s])
            for d, ks in enumerate(seg):
                off = d * width
                for k in ks:
                    ps[k].copy_(full[off:off + ps[k].numel()].view_as(ps[k]))
                    off += ps[k].numel()
