"""ZB-V (Qi et al. 2024 §6; torch's ScheduleZBVZeroBubble): two chunks per device in a V.

Device d holds stage d (chunk 0, going down) and stage 2p-1-d (chunk 1, coming back up). The
order is a hand-derived warm-up, an F-I-W steady state alternating the chunks, and a cool-down
of I passes followed by the deferred W passes. Like torch, fewer than 2p-1 micro-batches are
handled by building the order for 2p-1 and leaving the surplus cells idle.
"""
from __future__ import annotations

from octopipe.schedule.action import Action, F, I, W
from octopipe.schedule.generators._common import Row, check_shape, require, table
from octopipe.schedule.table import ScheduleTable, v_placement


def _zbv_row(p: int, d: int, m: int) -> Row:
    n = max(2 * p - 1, m)
    down, up = d, 2 * p - 1 - d
    cnt = {(down, F): 0, (up, F): 0, (down, I): 0, (up, I): 0, (down, W): 0, (up, W): 0}
    row: Row = [None] * d

    def emit(stage: int, kind) -> None:
        row.append(Action(stage, kind, cnt[stage, kind]))
        cnt[stage, kind] += 1

    for _ in range(2 * (p - d) - 1):
        emit(down, F)
    for _ in range(d):
        emit(up, F)
        emit(down, F)
    for _ in range(p - d):
        emit(up, F)
        emit(up, I)
        emit(up, W)
    while cnt[up, F] < cnt[down, F] or cnt[down, F] < n:
        if cnt[down, F] < n:
            emit(down, F)
        emit(down, I)
        emit(down, W)
        emit(up, F)
        emit(up, I)
        emit(up, W)
    for _ in range(d):
        emit(down, I)
        emit(up, I)
    for _ in range(p - d):
        emit(down, I)
        emit(down, W)
    while cnt[up, W] < cnt[up, I]:
        emit(up, W)
    while cnt[down, W] < cnt[down, I]:
        emit(down, W)
    return [a if a is None or a.microbatch < m else None for a in row]


def zbv(n_devices: int, n_microbatches: int, chunks: int = 2) -> ScheduleTable:
    """ZB-V on p devices (2p stages in a V); needs exactly two chunks per device."""
    check_shape("zbv", n_devices, n_microbatches, chunks)
    require(chunks == 2, f"zbv needs exactly 2 chunks per device (one V: down then up), got "
            f"chunks={chunks}; use chunks=2, or zbh1 for other chunk counts")
    rows = [_zbv_row(n_devices, d, n_microbatches) for d in range(n_devices)]
    return table(rows, v_placement(n_devices, 2), n_microbatches, "zbv")
