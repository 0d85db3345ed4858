"""Asynchronous schedules in the communication-aware simulator: the weight versions each stage
holds, their bytes on top of the simulator's memory model, and the throughput of the stream
against synchronous 1F1B flushed once per update window."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from octopipe.asynchronous.tables import ASYNC_SCHEDULES, AsyncSchedule, Rule, check_stream, schedule_versions
from octopipe.cluster import Cluster
from octopipe.cost.table import CostTable
from octopipe.schedule.generators.one_f_one_b import one_f_one_b
from octopipe.schedule.table import ScheduleTable
from octopipe.sim import Simulator
from octopipe.sim.sim_result import SimResult

WEIGHT_BYTES = 2.0   # one stashed copy of a parameter in bf16 (the weights only: no grads, no optimizer)


def is_async(table: ScheduleTable) -> bool:
    return table.name in ASYNC_SCHEDULES


def stage_param_bytes(costs: CostTable, partition: Sequence[tuple[int, int]]) -> tuple[float, ...]:
    """Bytes of one copy of each stage's weights."""
    return tuple(costs.range_sum("params", lo, hi) * WEIGHT_BYTES for lo, hi in partition)


def versions_of(table: ScheduleTable) -> AsyncSchedule:
    """The read versions of a named asynchronous table (2BW's window: one update per pp)."""
    rule = ASYNC_SCHEDULES[table.name]
    window = table.n_devices if rule is Rule.TWO_BW else 1
    check_stream(table.name, table.n_devices, table.n_microbatches, window)
    return schedule_versions(table, rule, window)


def flush_window(table: ScheduleTable) -> int:
    """Micro-batches per update of the synchronous baseline: 1F1B needs at least pp per flush."""
    return table.n_devices


def throughput_vs_1f1b(table: ScheduleTable, sim_of, run_kw: dict) -> dict:
    """Micro-batches per second of the stream and of 1F1B flushed every `flush_window`
    micro-batches (its minimal window), under the same durations; `sim_of(table)` builds a
    Simulator for a table of the same stages."""
    stream = sim_of(table).run(**run_kw)
    m = flush_window(table)
    flushed = sim_of(one_f_one_b(table.n_devices, m)).run(**run_kw)
    rate_async = table.n_microbatches / stream.makespan
    rate_sync = m / flushed.makespan
    return {"microbatches_per_s": float(rate_async), "flushed_1f1b_window": m,
            "flushed_1f1b_microbatches_per_s": float(rate_sync),
            "throughput_vs_1f1b": float(rate_async / rate_sync)}


def async_summary(table: ScheduleTable, res: SimResult, param_bytes: Sequence[float]) -> dict:
    """The `asynchronous` block of mode=simulate's summary."""
    av = versions_of(table)
    held = av.versions_held()
    stash = av.stash_bytes(param_bytes)
    per_dev = np.zeros(table.n_devices)
    for s, d in enumerate(table.placement):
        per_dev[d] += stash[s]
    peak = res.peak_memory + per_dev
    return {"rule": av.rule.value, "window": av.window, "versions_held": list(held),
            "stash_bytes": [float(x) for x in stash],
            "device_peak_memory_with_stash_bytes": [float(x) for x in peak],
            "peak_memory_with_stash_bytes": float(peak.max()),
            "updates_per_stage": list(av.updates_per_stage())}


def simulator_for(costs: CostTable, cluster: Cluster, partition: Sequence[tuple[int, int]]):
    """A `sim_of(table)` for `throughput_vs_1f1b`: the same partition, costs and cluster."""
    return lambda t: Simulator(t, costs, cluster, partition)


__all__ = ["WEIGHT_BYTES", "async_summary", "flush_window", "is_async", "simulator_for",
           "stage_param_bytes", "throughput_vs_1f1b", "versions_of"]
