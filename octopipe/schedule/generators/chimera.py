"""Chimera (Li & Hoefler SC'21): two pipelines running in opposite directions over the same devices.

Replica 0 (down) places stage s on device s; replica 1 (up) places stage s on device p-1-s.
Micro-batches alternate between them (even ones down, odd ones up), so each device holds one
stage of each replica. Each direction runs 1F1B over at most p/2 micro-batches at a time
(Chimera's basic unit); the table is built by unit-slot list scheduling with those caps,
backward passes first and older micro-batches first.
"""
from __future__ import annotations

from octopipe.schedule.action import B
from octopipe.schedule.generators._common import Pools, check_shape, priority_rows, require, table
from octopipe.schedule.table import ScheduleTable


def chimera(n_devices: int, n_microbatches: int, chunks: int = 1) -> ScheduleTable:
    """Bidirectional Chimera on an even number of devices with an even number of micro-batches."""
    check_shape("chimera", n_devices, n_microbatches, chunks)
    p, m = n_devices, n_microbatches
    require(p % 2 == 0, f"chimera pairs each down stage with an up stage on the same device and "
            f"needs an even number of devices, got n_devices={p}; use "
            f"{p + 1 if p == 1 else f'{p - 1} or {p + 1}'}")
    require(m % 2 == 0, f"chimera splits the micro-batches evenly between its two pipelines and "
            f"needs an even count, got n_microbatches={m}; use {m + 1}")
    require(chunks == 1, f"chimera holds one stage per pipeline per device (chunks=1), got "
            f"chunks={chunks}")
    down = tuple(range(p))
    up = tuple(reversed(range(p)))
    mb_replica = tuple(k % 2 for k in range(m))

    def device_of(a):
        return (up if mb_replica[a.microbatch] else down)[a.stage]

    half = p // 2
    caps = {}
    for d in range(p):
        caps[d, 0] = min(p - d, half)
        caps[d, 1] = min(d + 1, half)
    rows = priority_rows(
        devices_of=device_of, n_devices=p, n_stages=p, n_microbatches=m, split_backward=False,
        priority=lambda a: (0 if a.kind is B else 1, a.microbatch),
        pools=Pools(lambda a: (device_of(a), mb_replica[a.microbatch]), caps), name="chimera")
    return table(rows, down, m, "chimera", replicas=(up,), mb_replica=mb_replica)
