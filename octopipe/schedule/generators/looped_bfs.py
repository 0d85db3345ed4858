"""Looped BFS (Lamy-Poirier 2023, breadth-first pipeline parallelism): torch's ScheduleLoopedBFS.

Stages are looped over the devices (stage s on device s mod p). Each device runs every forward
of its first stage, then of its next one, and so on; then the backwards in reverse.
"""
from __future__ import annotations

from octopipe.schedule.action import Action, B, F
from octopipe.schedule.generators._common import Row, check_shape, table
from octopipe.schedule.table import ScheduleTable, loop_placement


def looped_bfs(n_devices: int, n_microbatches: int, chunks: int = 2) -> ScheduleTable:
    """Time-aligned as torch's table: d leading idle cells, 2(p-1-d) between F and B phases."""
    check_shape("looped_bfs", n_devices, n_microbatches, chunks)
    p, m = n_devices, n_microbatches
    rows: list[Row] = []
    for d in range(p):
        stages = range(d, p * chunks, p)
        row: Row = [None] * d
        row += [Action(s, F, k) for s in stages for k in range(m)]
        row += [None] * (2 * (p - 1 - d))
        row += [Action(s, B, k) for s in reversed(stages) for k in reversed(range(m))]
        rows.append(row)
    return table(rows, loop_placement(p, chunks), m, "looped_bfs")
