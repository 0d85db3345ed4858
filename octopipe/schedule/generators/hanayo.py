"""Hanayo (Liu et al. SC'23): wave-like pipeline parallelism.

With W waves every device holds 2W chunks placed in a zig-zag (V per wave): down the devices,
back up, and again. The table is built by unit-slot list scheduling: backward passes first,
then forwards, older micro-batches (and deeper stages) first, with at most p·2W chunk
activations per device (1F1B's memory of p whole-device micro-batches).
"""
from __future__ import annotations

from octopipe.schedule.action import B
from octopipe.schedule.generators._common import Pools, check_shape, priority_rows, require, table
from octopipe.schedule.table import ScheduleTable, v_placement


def hanayo(n_devices: int, n_microbatches: int, chunks: int = 2) -> ScheduleTable:
    """Hanayo with chunks = 2·waves stages per device (chunks must be even)."""
    check_shape("hanayo", n_devices, n_microbatches, chunks)
    require(chunks % 2 == 0, f"hanayo's waves each take two chunks per device (down and back up), "
            f"so chunks must be even, got chunks={chunks}; use {chunks + 1}")
    p, m, v = n_devices, n_microbatches, chunks
    placement = v_placement(p, v)
    rows = priority_rows(
        devices_of=lambda a: placement[a.stage], n_devices=p, n_stages=p * v, n_microbatches=m,
        split_backward=False, priority=lambda a: (0 if a.kind is B else 1, a.microbatch, -a.stage),
        pools=Pools(lambda a: placement[a.stage], dict.fromkeys(range(p), p * v)), name="hanayo")
    return table(rows, placement, m, "hanayo")
