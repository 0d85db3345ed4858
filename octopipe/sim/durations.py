"""Seconds and bytes for a compiled program: what a partition, a CostTable and a Cluster imply.

Compute: the sum of the stage's layers on the device's kind (B = I + W), read from
`octopipe.cost.stage_costs.StageCosts`. Transfers:
`latency + bytes / bandwidth` on `cluster.link(src, dst)`; a forward transfer out of stage s
carries the output of its last layer, a backward one the gradient of stage s's input (the same
size as the output of stage s-1). Memory: F allocates the stage's activation bytes; I frees all
but `w_act_bytes`, W frees the rest, B frees everything. Static bytes (parameters, gradients,
optimizer state) count once per stage a device holds in any placement, so Chimera's replicas
count twice. Data parallelism (`GradSync`, optional): each stage's gradient synchronization
(`octopipe.cost.collectives.dp_sync_seconds`) runs on its device's DP link after the stage's last
backward (overlapping the cool-down's remaining backward work) or after the device's last compute.
Tensor parallelism: the TP collectives are inside the CostTable's F and I (`cost.tp`,
`octopipe.cost.collectives`); RRFP's agreement before each task with TP collectives
(`TpAgreement`, set by `octopipe.sim.agreement`) is charged by the simulator under ready-first.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from octopipe.cluster import Cluster
from octopipe.cost.stage_costs import StageCosts
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.plan import Partition
from octopipe.sim.program import FWD, Program


@dataclass(frozen=True, eq=False)
class GradSync:
    """End-of-iteration data-parallel gradient synchronization: [S] seconds per stage on the DP
    link of the stage's device; `overlap`: a stage starts as soon as its last backward ends
    (else once its device has finished all compute)."""

    seconds: np.ndarray
    overlap: bool = True


@dataclass(frozen=True, eq=False)
class TpAgreement:
    """RRFP's TP agreement: `seconds` (one scalar all-gather) before each compute node where
    `tasks` ([n_compute] bools) is set; charged under ready-first only."""

    seconds: float
    tasks: np.ndarray


@dataclass(frozen=True, eq=False)
class Durations:
    """Per compute node and per transfer seconds, per node memory deltas, per device limits."""

    compute: np.ndarray        # [n_compute] seconds
    transfer: np.ndarray       # [n_transfers] seconds
    transfer_bytes: np.ndarray  # [n_transfers]
    alloc: np.ndarray          # [n_compute] bytes allocated when the node starts
    free: np.ndarray           # [n_compute] bytes freed when the node ends
    static: np.ndarray         # [n_devices] bytes held all along
    capacity: np.ndarray       # [n_devices] device memory bytes (inf when unknown)
    peak_flops: np.ndarray     # [n_devices]
    train_flops: float         # FLOPs of one iteration (F + B = 3 forward), 0 when unknown
    tokens: float              # tokens of one iteration, 0 when unknown
    grad_sync: GradSync | None = None   # data-parallel gradient sync per stage (None: dp = 1)
    agreement: TpAgreement | None = None  # RRFP's TP agreement per task (None: tp = 1, or not charged)

    def scaled(self, compute: np.ndarray | None = None, transfer: np.ndarray | None = None) -> Durations:
        """The same durations with some arrays replaced (jitter, what-if studies)."""
        return replace(self, compute=self.compute if compute is None else compute,
                       transfer=self.transfer if transfer is None else transfer)


def bind(program: Program, partition: Partition | Sequence[tuple[int, int]] | None, cost: CostTable,
         cluster: Cluster, tokens_per_microbatch: int | None = None) -> Durations:
    """Durations of every node of `program` for one partition, cost table and cluster."""
    n_s, n_d = program.n_stages, program.n_devices
    if partition is None:
        partition = Partition.uniform(cost.n_layers, n_s)
    partition = Partition.of(partition)
    if len(partition) != n_s:
        raise ConfigError(f"partition has {len(partition)} stages, the table has {n_s}; give one "
                          "layer range per stage")
    if partition.n_layers > cost.n_layers:
        raise ConfigError(f"partition reaches layer {partition.n_layers} but the cost table has "
                          f"{cost.n_layers} layers")
    if cluster.n_devices < n_d:
        raise ConfigError(f"the table has {n_d} devices but cluster {cluster.name!r} has "
                          f"{cluster.n_devices}; set pp <= {cluster.n_devices} or use a larger cluster")
    cols = list(cost.columns_for(cluster, n_d))
    used = sorted(set(cols))
    # a stage may run on devices of several kinds (replicated placements): cost it on each
    per_col = {k: StageCosts.bind(cost, partition, program.table.placement, [k] * n_d) for k in used}
    fiwb = np.zeros((len(cost.kinds), 4, n_s))
    for k in used:
        sc = per_col[k]
        fiwb[k] = (sc.f, sc.i, sc.w, sc.b)
    col_of_dev = np.asarray(cols, dtype=np.int64)
    compute = fiwb[col_of_dev[program.c_dev], program.c_kind, program.c_stage]
    sc0 = per_col[used[0]]
    act, wact, static_stage = sc0.act_bytes, sc0.w_act_bytes, sc0.static_bytes
    out_bytes = sc0.out_bytes
    ks, st = program.c_kind, program.c_stage
    alloc = np.where(ks == 0, act[st], 0.0)
    free = np.select([ks == 1, ks == 2, ks == 3], [act[st] - wact[st], wact[st], act[st]], 0.0)
    sender_stage = program.c_stage[program.t_producer]
    tbytes = np.where(program.t_dir == FWD, out_bytes[sender_stage],
                      out_bytes[np.maximum(sender_stage - 1, 0)])
    link_time = {}
    for a, b in program.links:
        link = cluster.link(a, b)
        link_time[(a, b)] = (link.latency, link.bandwidth) if link is not None else (0.0, np.inf)
    lat = np.array([link_time[l][0] for l in program.links] or [0.0])
    bw = np.array([link_time[l][1] for l in program.links] or [np.inf])
    transfer = lat[program.t_link] + tbytes / bw[program.t_link] if len(tbytes) else np.zeros(0)
    static = np.zeros(n_d)
    for pl in program.table.all_placements():
        for s, d in enumerate(pl):
            static[d] += static_stage[s]
    capacity = np.array([cluster.kind_of(d).memory_bytes for d in range(n_d)], dtype=np.float64)
    peak = np.array([cluster.kind_of(d).peak_flops for d in range(n_d)], dtype=np.float64)
    fwd_flops = float(cost.flops[:partition.n_layers].sum()) if cost.flops is not None else 0.0
    tokens = tokens_per_microbatch if tokens_per_microbatch is not None else cost.tokens_per_microbatch
    n_m = program.n_microbatches
    return Durations(compute=np.ascontiguousarray(compute, dtype=np.float64),
                     transfer=np.asarray(transfer, dtype=np.float64), transfer_bytes=tbytes,
                     alloc=alloc, free=free, static=static, capacity=capacity, peak_flops=peak,
                     train_flops=3.0 * fwd_flops * n_m, tokens=float(tokens or 0) * n_m)


def with_grad_sync(dur: Durations, seconds: Sequence[float] | np.ndarray, overlap: bool = True) -> Durations:
    """`dur` with each stage's data-parallel gradient synchronization (seconds per stage)."""
    return replace(dur, grad_sync=GradSync(np.asarray(seconds, dtype=np.float64), bool(overlap)))


def uniform(program: Program, f: float = 1.0, b: float = 2.0, w: float | None = None,
            transfer: float = 0.0, act_bytes: float = 1.0) -> Durations:
    """Equal stages: F, B (or I = b - w and W = w) seconds, a fixed transfer time (tests, bench)."""
    k = program.c_kind
    i_time = b - (w or 0.0)
    compute = np.select([k == 0, k == 1, k == 2, k == 3], [f, i_time, w or 0.0, b]).astype(np.float64)
    n_t, n_d = program.n_transfers, program.n_devices
    alloc = np.where(k == 0, act_bytes, 0.0)
    free = np.where((k == 1) | (k == 3), act_bytes, 0.0)
    return Durations(compute=compute, transfer=np.full(n_t, float(transfer)), transfer_bytes=np.zeros(n_t),
                     alloc=alloc, free=free, static=np.zeros(n_d), capacity=np.full(n_d, np.inf),
                     peak_flops=np.zeros(n_d), train_flops=0.0, tokens=0.0)
