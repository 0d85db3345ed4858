"""Zero-bubble schedules of Qi et al. 2024 (arXiv 2401.10241) with split backward (I, then W).

- ZB-H1 (torch's ScheduleInterleavedZeroBubble, "ZB1P"): 1F1B's memory; device d defers its W
  passes by d steps so that they fill the drain. Any number of looped chunks.
- ZB-H2: up to 2p-1 micro-batches in flight per device fill the warm-up with extra forwards and
  let later devices defer their W passes into the drain; built by unit-slot list scheduling with
  priority I > F > W. At unit costs it is the paper's parallelogram: every device is busy for 3m
  consecutive slots and the makespan is 3m + p - 1.
"""
from __future__ import annotations

from octopipe.schedule.action import F, I, W
from octopipe.schedule.generators._common import Pools, align_lockstep, check_shape, priority_rows, require, table
from octopipe.schedule.generators.interleaved import interleaved_row
from octopipe.schedule.table import ScheduleTable, loop_placement


def zbh1(n_devices: int, n_microbatches: int, chunks: int = 1) -> ScheduleTable:
    """ZB-H1 / ZB1P over `chunks` looped stages per device, aligned by data dependencies."""
    check_shape("zbh1", n_devices, n_microbatches, chunks)
    rows = [interleaved_row(n_devices, d, n_microbatches, chunks, zero_bubble=True)
            for d in range(n_devices)]
    rows = align_lockstep(rows, n_devices * chunks)
    return table(rows, loop_placement(n_devices, chunks), n_microbatches, "zbh1")


_H2_ORDER = {I: 0, F: 1, W: 2}


def zbh2(n_devices: int, n_microbatches: int, chunks: int = 1) -> ScheduleTable:
    """ZB-H2: one stage per device, each device holds at most 2p-1 micro-batches (until W)."""
    check_shape("zbh2", n_devices, n_microbatches, chunks)
    require(chunks == 1, f"zbh2 runs one stage per device (chunks=1), got chunks={chunks}; "
            "use zbh1 (ZB1P) for looped chunks or zbv for a V of two")
    p = n_devices
    rows = priority_rows(
        devices_of=lambda a: a.stage, n_devices=p, n_stages=p, n_microbatches=n_microbatches,
        split_backward=True, priority=lambda a: (_H2_ORDER[a.kind], a.microbatch),
        pools=Pools(lambda a: a.stage, dict.fromkeys(range(p), 2 * p - 1)), name="zbh2")
    return table(rows, loop_placement(p, 1), n_microbatches, "zbh2")
